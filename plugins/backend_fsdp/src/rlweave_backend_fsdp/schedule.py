"""The learning-rate schedule, shared with other backends: :mod:`rlweave.backend_helpers.schedule`."""

from rlweave.backend_helpers.schedule import WarmupSchedule

__all__ = ["WarmupSchedule"]
