"""The HTTP dialects of inference servers, as requests to send and answers to parse: ``sglang`` (SGLang's native
API, also spoken by ``asyncrl serve``) and ``vllm`` (vLLM >= 0.32 with ``VLLM_SERVER_DEV_MODE=1
--enable-scale-out``: ``/inference/v1/generate``, ``/pause``, ``/resume``, ``/collective_rpc``
``reload_weights``, ``/update_weight_version``; see docs/engine.md for the exact flags)."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.engine.sampling import derive_seed
from asyncrl.types import Completion, SamplingParams


@dataclass(frozen=True)
class Call:
    """One control request: POST ``path`` with a JSON body and/or query parameters."""

    path: str
    json: dict | None = None
    params: dict | None = None


class SGLangAPI:
    """SGLang's native API (``asyncrl serve`` speaks it too)."""

    name = "sglang"
    generate_path = "/generate"

    def generate_body(self, ids: list[int], p: SamplingParams) -> dict:
        sp = {
            "n": p.n,
            "max_new_tokens": p.max_new_tokens,
            "temperature": 0.0 if p.greedy else p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k or -1,
            **_stop_tokens(p),
        }
        if p.stop:
            sp["stop"] = list(p.stop)
        if p.seed is not None:
            sp["sampling_seed"] = _seed(p)
        return {"input_ids": ids, "sampling_params": sp, "return_logprob": True}

    def parse(self, body, prompt_ids: list[int], version: int) -> list[Completion]:
        results = body if isinstance(body, list) else [body]
        out = []
        for r in results:
            meta = r["meta_info"]
            pairs = meta.get("output_token_logprobs") or []
            ids = [int(x[1]) for x in pairs] if pairs else list(r.get("output_ids", []))
            versions = meta.get("output_token_versions")
            if versions is None or len(versions) != len(ids):
                versions = [_as_version(meta.get("weight_version"), version)] * len(ids)
            out.append(
                Completion(
                    prompt_ids,
                    ids,
                    [float(x[0]) for x in pairs],
                    [int(v) for v in versions],
                    _finish(meta.get("finish_reason")),
                )
            )
        return out

    def pause(self, keep: bool) -> list[Call]:
        return [Call("/pause_generation", {"mode": "in_place" if keep else "abort"})]

    def resume(self) -> list[Call]:
        return [Call("/continue_generation", {})]

    def load_from_disk(self, path: str, version: int) -> list[Call]:
        return [Call("/update_weights_from_disk", {"model_path": path, "weight_version": str(version)})]

    def set_version(self, version: int) -> list[Call]:
        return []


class VLLMAPI:
    """vLLM's token-in/token-out and RL endpoints (``VLLM_SERVER_DEV_MODE=1``, ``--enable-scale-out``)."""

    name = "vllm"
    generate_path = "/inference/v1/generate"

    def generate_body(self, ids: list[int], p: SamplingParams) -> dict:
        sp = {
            "n": p.n,
            "max_tokens": p.max_new_tokens,
            "temperature": 0.0 if p.greedy else p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k,
            "logprobs": 0,
            **_stop_tokens(p),
        }
        if p.stop:
            sp["stop"] = list(p.stop)
        if p.seed is not None:
            sp["seed"] = _seed(p)
        return {"token_ids": ids, "sampling_params": sp}

    def parse(self, body, prompt_ids: list[int], version: int) -> list[Completion]:
        out = []
        for c in sorted(body["choices"], key=lambda c: c["index"]):
            ids = list(c.get("token_ids") or [])
            content = (c.get("logprobs") or {}).get("content") or []
            versions = [version] * len(ids)
            for span in c.get("weight_versions") or []:
                v = _as_version(span.get("version"), version)
                versions[span["start"] : span["end"]] = [v] * (span["end"] - span["start"])
            out.append(
                Completion(
                    prompt_ids, ids, [float(x["logprob"]) for x in content], versions, _finish(c.get("finish_reason"))
                )
            )
        return out

    def pause(self, keep: bool) -> list[Call]:
        return [Call("/pause", params={"mode": "keep" if keep else "abort"})]

    def resume(self) -> list[Call]:
        return [Call("/resume")]

    def load_from_disk(self, path: str, version: int) -> list[Call]:
        return [
            Call("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}),
            *self.set_version(version),
        ]

    def set_version(self, version: int) -> list[Call]:
        return [Call("/update_weight_version", {"new_version": str(version)})]


APIS = {"sglang": SGLangAPI, "vllm": VLLMAPI}


def _seed(p: SamplingParams) -> int:
    """The seed a server gets: a resubmitted sample i > 0 of a group (``seed_offset``) gets a seed of its own, so
    that it does not continue on sample 0's draws (servers know no offset: it draws from a stream of its own, not
    the one an uninterrupted request would have used)."""
    return derive_seed(p.seed, p.seed_offset) if p.seed_offset else p.seed


def _stop_tokens(p: SamplingParams) -> dict:
    """Explicit stop tokens replace the model's end-of-sequence tokens (as in ``LocalEngine``); servers add
    theirs to the end-of-sequence tokens unless ``ignore_eos``. Negative ids (``NO_STOP_TOKENS``) match nothing."""
    if not p.stop_token_ids:
        return {}
    return {"stop_token_ids": [t for t in p.stop_token_ids if t >= 0], "ignore_eos": True}


def _finish(reason) -> str:
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return kind if kind in ("stop", "length", "abort") else "stop"


def _as_version(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
