"""Clients an episode gets: the official ``openai.AsyncOpenAI`` pointed at the proxy over HTTP with the
episode's key, or an in-process object with the same interface (``chat.completions.create``,
``completions.create``, ``models.list``) that calls the proxy directly (no HTTP, no ``openai`` package
needed). Both return the same response objects: ``openai``'s types when the package is installed, else
attribute-access views of the same JSON."""

from __future__ import annotations

from typing import Any


class Obj(dict):
    """A JSON object whose keys read as attributes too (``reply.choices[0].message.tool_calls``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def model_dump(self, **_) -> dict:
        return _plain(self)


def _wrap(value):
    if isinstance(value, dict):
        return Obj({k: _wrap(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _plain(value):
    """A request value as JSON data: pydantic objects (an ``openai`` message appended to the history as it
    came back) are dumped; the SDK's "not given" placeholders (``NOT_GIVEN``, ``omit``) are left out, as the
    ``openai`` client leaves them out of its requests."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None and not _placeholder(v)}
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_none=True))
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _placeholder(value) -> bool:
    """The ``openai`` SDK's marker of an argument not given (by class name: no import of ``openai`` needed)."""
    return type(value).__name__ in ("NotGiven", "Omit")


def as_response(kind: str, body: dict):
    """``body`` as ``openai``'s type for ``kind`` (``chat``/``completion``/``models``) if available, else Obj."""
    try:
        from openai.types import Completion
        from openai.types.chat import ChatCompletion
    except ImportError:
        return _wrap(body)
    if kind == "chat":
        return ChatCompletion.model_validate(body)
    if kind == "completion":
        return Completion.model_validate(body)
    return _wrap(body)


class _Endpoint:
    def __init__(self, call, kind: str):
        self._call, self._kind = call, kind

    async def create(self, **kwargs):
        return as_response(self._kind, await self._call(_plain(kwargs)))


class _Models:
    def __init__(self, proxy):
        self._proxy = proxy

    async def list(self):
        return _wrap(self._proxy.models())


class InProcessClient:
    """The proxy behind the ``openai.AsyncOpenAI`` interface, for one episode's ``key``. Errors raise
    ``asyncrl.agent.proxy.ProxyError`` (with ``.status``)."""

    def __init__(self, proxy, key: str):
        self.api_key = key

        class _Chat:
            completions = _Endpoint(lambda body: proxy.chat(key, body), "chat")

        self.chat = _Chat()
        self.completions = _Endpoint(lambda body: proxy.complete(key, body), "completion")
        self.models = _Models(proxy)

    async def close(self) -> None:
        pass
