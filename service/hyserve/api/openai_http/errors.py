"""OpenAI's error object, raised by the request parsers and answered by the app's middleware."""

from __future__ import annotations

from typing import Any

__all__ = ["OpenAIError"]


class OpenAIError(Exception):
    """A request OpenAI's API would answer with an error object; `status` is the HTTP status."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
