"""Anthropic's error object, and hyserve's validation messages reworded to name the body's fields.

Pure: `AnthropicError` carries the HTTP status and Anthropic's error type; `field_message` turns a
`ValidationError` text (which starts with the GenerateRequest field) into one that starts with the
Messages API field a client wrote.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AnthropicError", "error_type", "field_message"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (`api_error` for any other server error)."""
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


class AnthropicError(Exception):
    """A request the Messages API answers with an error object; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400, type_: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status = message, status
        self.type = type_ or error_type(status)

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


# GenerateRequest fields (the start of a validation message, or of its field path) -> the Messages
# API field, the most specific first
_FIELDS = {
    "stopping.max_tokens": "max_tokens",
    "stopping.stop_strings": "stop_sequences",
    "chat.tool_choice": "tool_choice",
    "chat.chat_template_kwargs": "chat_template_kwargs",
    "chat": "messages",
    "input": "messages",
}


def field_message(message: str) -> str:
    """A validation message with its leading proto field replaced by the body's field."""
    head, sep, rest = message.partition(":")
    if not sep:
        return message
    field, _, index = head.partition("[")
    if field.startswith("sampling."):
        return field.removeprefix("sampling.") + sep + rest
    if field == "chat.messages":  # the conversation is rearranged (system, tool results): keep the detail
        return "messages: " + message
    if field == "chat.tools":  # one body tool per proto tool, in order
        return f"tools[{index}" + sep + rest if index else "tools" + sep + rest
    for proto, name in _FIELDS.items():  # the most specific first
        if field == proto or field.startswith(proto + "."):
            return name + sep + rest
    return message
