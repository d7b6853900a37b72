"""RNG states as plain data: :mod:`rlweave.data.rng_state`, under the name the run loop and
older code use."""

from rlweave.data.rng_state import FORMAT, from_json, get_state, join, set_state, split, to_json  # noqa: F401
