"""Requires a future rlweave; must be reported incompatible without being imported."""
raise RuntimeError("rlw_future must not be imported")
