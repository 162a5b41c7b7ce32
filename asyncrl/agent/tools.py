"""Tool calls parsed from a reply's decoded text into OpenAI ``tool_calls``, for the agent only: the trained
tokens are the engine's, whatever the parser makes of them.

Parsers by model family (``agent.tool_parser``):
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, the tiny
  agent model, Hermes);
- ``llama3_json``: the whole reply is one JSON object ``{"name": ..., "parameters": {...}}``, optionally
  after ``<|python_tag|>`` (Llama 3.1+ JSON tool calling);
- ``none``: never a tool call.
Either format's arguments are read under ``arguments`` or ``parameters``, whichever key the model wrote.
A malformed call (not JSON, no name, arguments not an object) is not returned, is counted, and its text
stays in the reply's content so the agent sees what the model wrote.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, field

HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass
class Reply:
    content: str
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI format; arguments as a JSON string
    malformed: int = 0


def _strict_json(text: str):
    """JSON as every client reads it: NaN and Infinity, which Python's json accepts, are malformed, and so are a
    number beyond the float range (1e400 reads as inf), an integer too long to read and nesting too deep
    (JSONDecodeError for all)."""

    def refuse(name):
        raise json.JSONDecodeError(f"{name[:20]} is not JSON", text, 0)

    def finite(literal: str) -> float:
        value = float(literal)
        return value if math.isfinite(value) else refuse(literal)

    try:
        return json.loads(text, parse_constant=refuse, parse_float=finite)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as e:  # Python's 4300-digit limit on integers; depth
        raise json.JSONDecodeError(str(e)[:80], text, 0) from None


def _call(obj, args_key: str, other_key: str) -> dict | None:
    """An OpenAI tool call from ``{"name": ..., args_key: {...}}``; models of both formats write either key, so
    ``other_key`` is read when ``args_key`` is absent (never silently dropped arguments)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj[args_key] if args_key in obj else obj.get(other_key, {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = _strict_json(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


def parse_hermes(text: str) -> Reply:
    calls, malformed, kept = [], 0, []
    last = 0
    for m in HERMES_CALL.finditer(text):
        try:
            call = _call(_strict_json(m.group(1)), "arguments", "parameters")
        except json.JSONDecodeError:
            call = None
        kept.append(text[last : m.start()])
        if call is None:
            malformed += 1
            kept.append(m.group(0))
        else:
            calls.append(call)
        last = m.end()
    kept.append(text[last:])
    content = "".join(kept)
    if calls:
        content = content.strip()
    if "<tool_call>" in text[last:]:  # an opened call that never closed (cut at the length limit, say)
        malformed += 1
    return Reply(content, calls, malformed)


def parse_llama3_json(text: str) -> Reply:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return Reply(text)
    try:
        call = _call(_strict_json(body), "parameters", "arguments")
    except json.JSONDecodeError:
        call = None
    return Reply("", [call]) if call is not None else Reply(text, malformed=1)


def parse_none(text: str) -> Reply:
    return Reply(text)


PARSERS = {"hermes": parse_hermes, "llama3_json": parse_llama3_json, "none": parse_none}
