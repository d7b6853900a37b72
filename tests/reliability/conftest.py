"""The reliability suite: one test per guarantee, each recording what it measured.

A test takes the ``guarantee`` fixture and calls it once with what it showed::

    def test_hung_rank_is_reported(guarantee):
        ...
        guarantee("a hung rank is reported", f"in {elapsed:.1f} s (timeout 3 s)")

When ``RLWEAVE_RELIABILITY_OUT`` names a file, each call appends one JSON line
``{"guarantee", "measured", "test"}`` to it; ``bench/reliability.py`` runs this folder with
that variable set and prints the table. Without the variable the fixture only checks that
the arguments are non-empty strings.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import pytest

OUT_ENV = "RLWEAVE_RELIABILITY_OUT"


@pytest.fixture
def guarantee(request) -> Callable[[str, str], None]:
    def record(name: str, measured: str) -> None:
        if not (isinstance(name, str) and name and isinstance(measured, str) and measured):
            raise ValueError("guarantee(name, measured) takes two non-empty strings")
        out = os.environ.get(OUT_ENV)
        if out:
            with open(out, "a", encoding="utf-8") as f:
                f.write(json.dumps({"guarantee": name, "measured": measured, "test": request.node.nodeid}) + "\n")

    return record
