"""Response bodies of ``asyncrl serve``. The routes build them on a worker thread: decoding thousands of
tokens (and each token alone, for log-probs) would otherwise hold every other endpoint."""

from __future__ import annotations

import itertools
import time
import uuid

from asyncrl.types import Completion


def error_body(message: str, kind: str = "invalid_request_error") -> dict:
    """The error shape of every non-2xx answer. The message is made encodable (an exception may quote a
    client's malformed text) and bounded."""
    return {"error": {"message": message.encode("utf-8", "replace").decode("utf-8")[:2000], "type": kind}}


def trim_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """The text before the first stop string it contains, and that string (None if none)."""
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at], s


def native_results(state, groups: list[list[Completion]], stops: tuple[str, ...], return_logprob: bool) -> list:
    """SGLang's ``/generate`` answer: one dict per sample."""
    return [_native_result(state, c, stops, return_logprob) for group in groups for c in group]


def _native_result(state, c: Completion, stops: tuple[str, ...], return_logprob: bool) -> dict:
    text, matched = trim_at_stop(state.decode(c.output_ids), stops)
    if c.finish_reason == "stop":
        reason = {"type": "stop", "matched": matched if matched is not None else c.output_ids[-1]}
    elif c.finish_reason == "length":
        reason = {"type": "length", "length": len(c.output_ids)}
    else:
        reason = {"type": "abort", "message": "aborted by pause_generation or a weight update"}
    meta = {
        "id": uuid.uuid4().hex,
        "finish_reason": reason,
        "prompt_tokens": len(c.prompt_ids),
        "completion_tokens": len(c.output_ids),
        "cached_tokens": 0,
        "weight_version": str(c.versions[-1] if c.versions else state.engine.version),
        "output_token_versions": c.versions,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(c.logprobs, c.output_ids)]
    return {"text": text, "output_ids": c.output_ids, "meta_info": meta}


def completions(state, groups: list[list[Completion]], stops: tuple[str, ...], logprobs: int | None) -> dict:
    """OpenAI's ``/v1/completions`` answer."""
    choices = []
    for c in (c for g in groups for c in g):
        text, _ = trim_at_stop(state.decode(c.output_ids), stops)
        choice = {
            "index": len(choices),
            "text": text,
            "finish_reason": _openai_reason(c),
            "logprobs": None,
            "token_ids": c.output_ids,
        }
        if logprobs is not None:
            tokens = [state.decode([t]) for t in c.output_ids]
            offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0))[: len(tokens)]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": c.logprobs,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, c.logprobs)],
                "text_offset": offsets,
            }
        choices.append(choice)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage(groups),
    }


def chat(state, group: list[Completion], stops: tuple[str, ...], logprobs: bool) -> dict:
    """OpenAI's ``/v1/chat/completions`` answer."""
    choices = []
    for i, c in enumerate(group):
        content, _ = trim_at_stop(state.decode(c.output_ids), stops)
        lps = None
        if logprobs:
            lps = {
                "content": [
                    {"token": state.decode([t]), "logprob": lp, "top_logprobs": []}
                    for t, lp in zip(c.output_ids, c.logprobs)
                ]
            }
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": content},
                "finish_reason": _openai_reason(c),
                "logprobs": lps,
            }
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage([group]),
    }


def _openai_reason(c: Completion) -> str:
    return c.finish_reason if c.finish_reason in ("stop", "length") else "abort"


def _usage(groups: list[list[Completion]]) -> dict:
    prompt = sum(len(g[0].prompt_ids) for g in groups if g)
    completion = sum(len(c.output_ids) for g in groups for c in g)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
