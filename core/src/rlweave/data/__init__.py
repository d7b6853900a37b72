"""Data: records read from data files (:mod:`.records`, :mod:`.formats`, :mod:`.chat`; light) and
the batch moved between roles (``from rlweave.data.batch import Batch`` imports torch)."""
