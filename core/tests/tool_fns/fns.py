"""Tool functions of the tools-environment tests (loaded by path in sandboxed workers)."""

import os
import time


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "woke up"


def crash() -> str:
    """Kill the worker process."""
    os._exit(3)


def hog(gib: int) -> int:
    """Allocate gib GiB."""
    block = bytearray(gib * 2**30)
    return len(block)


def fail(message: str) -> str:
    """Raise."""
    raise RuntimeError(message)
