"""Errors the endpoint answers with, in the OpenAI schema:
``{"error": {"message", "type", "param", "code"}}`` with a 4xx (the request) or 5xx (the engine)
status."""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    """A request the endpoint refuses: ``status`` (HTTP), ``message`` (one line a user can act
    on), ``param`` (the request field at fault, if one), ``code`` (a short machine name)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
