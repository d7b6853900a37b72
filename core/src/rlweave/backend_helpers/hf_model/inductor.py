"""Helper kernels compiled by inductor once per process (the CPU paths of ``compile: true``)."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def compiled(fn):
    """``torch.compile(fn, dynamic=True)``, built on first use and shared by every later call in
    the process: shapes vary with each micro-batch, so one dynamic graph serves them all."""
    return torch.compile(fn, dynamic=True)
