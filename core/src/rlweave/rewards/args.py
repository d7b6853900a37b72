"""``rewards[].args`` of the built-in rewards (pydantic, light): validated in pass two like
any plugin section, so a misspelt argument is an error instead of being ignored."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlweave.rewards.rules import DEFAULT_FORMAT

REGEX_FLAGS = "ismx"


class ArithExactArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["first", "full"] = Field(
        "first", description="first: the response's first number counts; full: the whole response must be the number."
    )


class FormatArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(DEFAULT_FORMAT, description="Python regular expression (default: a final answer line).")
    where: Literal["last_line", "response"] = Field("last_line", description="Text matched: the last non-empty line, "
                                                    "or the whole stripped response.")
    match: Literal["full", "search"] = Field("full", description="full: the whole text must match; search: anywhere.")
    flags: str = Field("i", description=f"Regex flags, letters of '{REGEX_FLAGS}'.")

    @field_validator("flags")
    @classmethod
    def _flags(cls, value: str) -> str:
        bad = sorted(set(value) - set(REGEX_FLAGS))
        if bad:
            raise ValueError(f"unknown regex flag(s) {''.join(bad)!r}; use letters of '{REGEX_FLAGS}'")
        return value

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value
