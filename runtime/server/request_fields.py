"""The typed access every request parser shares: the OpenAI-style error, and fields read with their type checked
(each rejection names the field)."""
from __future__ import annotations

from typing import Any

from toolkit.runtime.sampling.sampling_params import is_valid_text


class RequestError(Exception):
    """An HTTP error with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code or self.status}}


def bad(param: str, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}", param=param)


def typed(body: dict, name: str, kinds: tuple[type, ...], default: Any, what: str) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise bad(name, f"must be {what}, got a boolean")
    if not isinstance(value, kinds):
        raise bad(name, f"must be {what}, got {type(value).__name__}")
    return value


def boolean(body: dict, name: str, default: bool) -> bool:
    return typed(body, name, (bool,), default, "a boolean")


def valid_text(value: str, param: str) -> str:
    if not is_valid_text(value):
        raise bad(param, "must be valid Unicode text (it holds a lone surrogate such as \\ud800)")
    return value
