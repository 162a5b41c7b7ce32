"""Chat messages as chat templates take them: ``normalize`` turns OpenAI-style messages (content parts, tool calls
with JSON-string arguments, the ``developer`` role) into the plain form the open models' templates read."""

from __future__ import annotations

import json


class TemplateError(ValueError):
    """The chat template cannot be bridged (it re-renders earlier turns differently) or rejects the chat."""


def normalize(messages: list[dict]) -> list[dict]:
    """Messages as the chat template should see them: ``content`` None -> "", tool-call ``arguments`` given as
    a JSON string (what OpenAI clients send back) parsed into a dict (what templates expect), the ``developer``
    role (OpenAI's newer name for ``system``, which the open models' templates do not know: Qwen's drop such a
    message without a word) as ``system``, and only the fields a template reads."""
    out = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        msg = {"role": role, "content": content_text(m.get("content"))}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = m[key]
        if m.get("weight") == 0:  # OpenAI's fine-tuning format: an assistant turn not to learn (SFT skips it)
            msg["weight"] = 0
        if m.get("tool_calls"):
            msg["tool_calls"] = [_tool_call(c) for c in m["tool_calls"]]
        out.append(msg)
    return out


def content_text(content) -> str:
    """A message's text: its string, or the text of its OpenAI content parts; None is "" (TemplateError for any
    other content)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise TemplateError(f"message content must be a string or a list of text parts, not {type(content).__name__}")


def _tool_call(call: dict) -> dict:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):  # not JSON, a 5000-digit number, nesting too deep
            pass  # kept as the string the model wrote; the template renders it as it is
    return {"type": "function", "id": call.get("id"), "function": {"name": fn.get("name", ""), "arguments": args}}
