"""A third-party advantage estimator, packaged outside rlweave (a test plugin)."""
