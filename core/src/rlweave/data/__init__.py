"""Data moved between roles. ``from rlweave.data.batch import Batch`` imports torch."""
