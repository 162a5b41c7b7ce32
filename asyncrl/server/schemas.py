"""Request bodies of ``asyncrl serve``: what is accepted, field by field.

Fields of other servers' APIs (``rid``, ``model``, ...) are accepted and ignored. Otherwise validation is
strict, so that a mistake is answered with a 4xx naming the field instead of being served wrongly or failing
later with a 500: numbers are finite (a raw ``NaN`` in the JSON is refused), integers are integers (``true`` is
not 1), strings are valid Unicode (a lone surrogate cannot be tokenised or written back as UTF-8), and every
list has a length bound (``limits.py``) checked before its items.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator

from asyncrl.engine.requests import NO_STOP_TOKENS
from asyncrl.server.limits import (
    MAX_BUCKET_TENSORS,
    MAX_MESSAGES,
    MAX_PROMPTS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TENSOR_DIMS,
)
from asyncrl.types import SamplingParams

INT32_MAX = 2**31 - 1
"""Bound of counts that become tensor entries or loop bounds (``top_k``, ``n``, token budgets)."""


class BadRequest(ValueError):
    """A request the server understood but cannot serve (400)."""


def _well_formed(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"contains a lone surrogate ({s[e.start]!r} at character {e.start}); send valid Unicode text"
        ) from None
    return s


Text = Annotated[str, AfterValidator(_well_formed)]


def _all_of(kind: type, items: list) -> bool:
    """Whether every item is exactly a ``kind`` (for int: not a bool), in one C-speed pass. Pydantic would
    collect one error per wrong item: for a few MB of wrong items that takes seconds, on the event loop."""
    return not items or set(map(type, items)) == {kind}


def _batch(prompts: list) -> list:
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}")
    return prompts


def _texts(value: Any) -> str | list[str]:
    """``text``: a text or a non-empty list of texts (a batch)."""
    if type(value) is str:
        return _well_formed(value)
    if type(value) is list and value and _all_of(str, value):
        return [_well_formed(v) for v in _batch(value)]
    raise ValueError("must be a text or a non-empty list of texts")


def _is_ids(value: Any) -> bool:
    return type(value) is list and _all_of(int, value)


def _token_ids(value: Any) -> list[int] | list[list[int]]:
    """``input_ids``: a list of integer token ids, or a non-empty list of such lists (a batch)."""
    if _is_ids(value):
        return value
    if type(value) is list and _all_of(list, value) and all(map(_is_ids, _batch(value))):
        return value
    raise ValueError("must be a list of integer token ids, or a list of such lists")


def _prompt(value: Any) -> str | list[str] | list[int] | list[list[int]]:
    """OpenAI's ``prompt``: a text or texts, or token ids (a list, or a list of lists), told apart by the first
    item."""
    texts = type(value) is str or (type(value) is list and bool(value) and type(value[0]) is str)
    return _texts(value) if texts else _token_ids(value)


def _stops(value: Any) -> str | list[str]:
    """``stop``: one string or a list of them (``limits.MAX_STOP_STRINGS``, ``MAX_STOP_CHARS``)."""
    stops = [value] if type(value) is str else value
    if type(stops) is not list or not _all_of(str, stops):
        raise ValueError("must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(f"stop strings may have at most {MAX_STOP_CHARS} characters")
    return [_well_formed(s) for s in stops] if type(value) is list else _well_formed(value)


def _version(value: Any) -> str | int:
    """``weight_version`` as sent: an integer or a string (parsed and range-checked where it is used)."""
    if type(value) is str:
        return _well_formed(value)
    if type(value) is int:
        return value
    raise ValueError("must be an integer or a string of one")


def _plain(check, accepts) -> Any:
    """A field validated by ``check`` alone: its errors name the field, not the union member that failed."""
    return Annotated[Any, PlainValidator(check, json_schema_input_type=accepts)]


TokenIds = _plain(_token_ids, list[int] | list[list[int]])
Prompt = _plain(_prompt, str | list[str] | list[int] | list[list[int]])
Texts = _plain(_texts, str | list[str])
Stop = _plain(_stops, str | list[str])
Version = _plain(_version, str | int)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class NativeSampling(_Lenient):
    max_new_tokens: int = Field(128, ge=1, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=INT32_MAX)
    n: int = Field(1, ge=1, le=INT32_MAX)
    stop: Stop | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    sampling_seed: int | None = Field(None, ge=0, le=2**63 - 1)


class GenerateRequest(_Lenient):
    input_ids: TokenIds | None = None
    text: Texts | None = None
    sampling_params: NativeSampling = Field(default_factory=NativeSampling)
    return_logprob: bool = False


class PauseRequest(_Lenient):
    mode: Text = "abort"


class UpdateFromDisk(_Lenient):
    model_path: Text
    weight_version: Version | None = None


class InitGroup(_Lenient):
    master_address: Text = Field(min_length=1)
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2, le=1 << 16)
    group_name: Text = "weight_update_group"
    backend: Text = "gloo"


class UpdateFromDistributed(_Lenient):
    names: list[Text] = Field(max_length=MAX_BUCKET_TENSORS)
    dtypes: list[Text] = Field(max_length=MAX_BUCKET_TENSORS)
    shapes: list[Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_TENSOR_DIMS)]] = Field(
        max_length=MAX_BUCKET_TENSORS
    )
    group_name: Text | None = None
    weight_version: Version | None = None


class DestroyGroup(_Lenient):
    group_name: Text | None = None


class CompletionRequest(_Lenient):
    prompt: Prompt
    max_tokens: int = Field(16, ge=1, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=INT32_MAX)
    n: int = Field(1, ge=1, le=INT32_MAX)
    stop: Stop | None = None
    logprobs: int | None = Field(None, ge=0)
    stream: bool = False
    echo: bool = False
    seed: int | None = Field(None, ge=0, le=2**63 - 1)


class Message(_Lenient):
    role: Text
    content: Text


class ChatRequest(_Lenient):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=INT32_MAX)
    n: int = Field(1, ge=1, le=INT32_MAX)
    stop: Stop | None = None
    logprobs: bool = False
    stream: bool = False
    seed: int | None = Field(None, ge=0, le=2**63 - 1)


def stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in stops):
        raise BadRequest("stop strings must be non-empty")
    return stops


def sampling_params(
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    stop_token_ids: list[int] | None = None,
    ignore_eos: bool = False,
    eos: tuple[int, ...] = (),
    stop: tuple[str, ...] = (),
    seed: int | None = None,
) -> SamplingParams:
    """Engine sampling parameters from an API's fields: temperature 0 means greedy, top_k -1 or 0 means off,
    the model's end-of-sequence tokens stop a sample unless ``ignore_eos``."""
    stops = tuple(t for t in stop_token_ids or () if t >= 0) + (() if ignore_eos else eos)
    try:
        return SamplingParams(
            n=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature or 1.0,
            top_p=top_p,
            top_k=max(top_k, 0),
            greedy=temperature == 0,
            stop_token_ids=stops or NO_STOP_TOKENS,
            stop=stop,
            seed=seed,
        )
    except ValueError as e:
        raise BadRequest(str(e)) from e
