"""Raises on import: a dependency is missing."""
import rlw_missing_dependency  # noqa: F401
