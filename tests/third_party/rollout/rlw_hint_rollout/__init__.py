"""A third-party rollout, packaged outside rlweave (a test plugin)."""
