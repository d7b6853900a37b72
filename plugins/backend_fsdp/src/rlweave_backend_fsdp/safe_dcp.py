"""Loading DCP directories without running their pickles: :mod:`rlweave.backend_helpers.safe_dcp`
(shared with other backends)."""

from rlweave.backend_helpers.safe_dcp import ALLOWED, METADATA, SafePlanner, SafeReader, load, read_metadata

__all__ = ["ALLOWED", "METADATA", "SafePlanner", "SafeReader", "load", "read_metadata"]
