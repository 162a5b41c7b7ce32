"""What ``asyncrl serve`` holds between requests (the engine, the tokenizer, the weight receiver, counters),
the work requests hand off the event loop, and loading a checkpoint at start-up.

Nothing here blocks the event loop: tokenising runs on worker threads, and whatever may wait long (loading
weights, joining a weight update group, receiving a broadcast) on daemon threads of its own, so that neither
``/health`` nor the process's exit on SIGTERM ever waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from asyncrl.engine.local import LocalEngine
from asyncrl.engine.requests import VersionConflict
from asyncrl.server.limits import (
    CHARS_PER_TOKEN,
    GROUP_TIMEOUT_S,
    KV_MEMORY_FRACTION,
    MAX_REQUEST_BYTES,
    MAX_VERSION,
    UPDATE_TIMEOUT_S,
)
from asyncrl.server.schemas import BadRequest
from asyncrl.types import Completion, SamplingParams, WeightUpdate

log = logging.getLogger(__name__)


class Conflict(ValueError):
    """A request that contradicts the server's state, such as a weight version going backwards (409)."""


class Unavailable(RuntimeError):
    """The server cannot serve now: it is shutting down, or a weight update did not finish in time (503)."""


class StartupError(RuntimeError):
    """Why the server cannot start: one line, naming the flag or path to fix."""


async def in_daemon_thread(fn: Callable, *args):
    """``fn(*args)`` on a daemon thread of its own. For calls that may block for minutes (a group join with an
    unreachable master, a weight transfer): the default executor's threads are joined at exit, so one such call
    would hold up the shutdown on SIGTERM; a daemon thread never does. If the caller stops waiting, the result
    is dropped."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            outcome = (fn(*args), None)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting request
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the event loop has closed: nobody is waiting any more
            pass

    threading.Thread(target=target, name=f"asyncrl-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await future


@dataclass
class ServerState:
    engine: LocalEngine
    tokenizer: Any
    model_name: str
    model_path: str
    update_timeout_s: float = UPDATE_TIMEOUT_S
    group_timeout_s: float = GROUP_TIMEOUT_S
    max_request_bytes: int = MAX_REQUEST_BYTES
    requests_completed: int = field(default=0, init=False)
    requests_cancelled: int = field(default=0, init=False)  # generating requests whose client went away
    internal_errors: int = field(default=0, init=False)  # 500s answered

    def __post_init__(self):
        from asyncrl.weights.receive import DistReceiver

        self.eos = tuple(self.engine.default_stop)
        self.receiver = DistReceiver(
            self._apply_state_dict, timeout_s=self.update_timeout_s, shapes=self.engine.weight_shapes
        )
        self.update_lock = threading.Lock()

    @property
    def max_chars(self) -> int:
        """The longest text worth tokenising (``limits.CHARS_PER_TOKEN``)."""
        return self.engine.max_len * CHARS_PER_TOKEN

    # ---- text -------------------------------------------------------------------------------------------
    def check_chars(self, field_name: str, n_chars: int) -> None:
        if n_chars > self.max_chars:
            raise BadRequest(
                f"{field_name} has {n_chars} characters, more than this server's max_len "
                f"{self.engine.max_len} tokens can hold (at most {CHARS_PER_TOKEN} characters per "
                f"token: {self.max_chars})"
            )

    async def encode(self, texts: list[str], field_name: str) -> list[list[int]]:
        """Token ids of each text, tokenised off the event loop once every length is known to be plausible."""
        if self.tokenizer is None:
            raise BadRequest(f"{field_name}: this server has no tokenizer: send token ids")
        for i, t in enumerate(texts):
            self.check_chars(field_name if len(texts) == 1 else f"{field_name}[{i}]", len(t))
        return await asyncio.to_thread(lambda: [self._encode(t) for t in texts])

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def decode(self, ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(ids, skip_special_tokens=True)

    async def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The chat template applied to ``messages`` (off the event loop), as token ids."""
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest("messages: this server's tokenizer has no chat template")
        self.check_chars("messages", sum(len(m["content"]) + len(m["role"]) for m in messages))
        return await asyncio.to_thread(self._render_chat, messages)

    def _render_chat(self, messages: list[dict]) -> list[int]:
        from jinja2 import TemplateError

        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateError as e:
            raise BadRequest(f"messages: the model's chat template refused them: {e}") from e
        return self._encode(text)

    # ---- generation ------------------------------------------------------------------------------------
    async def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """The samples of every prompt; all prompts are checked before any is queued, so a refused batch
        leaves no work behind."""
        for i, p in enumerate(prompts):
            try:
                self.engine.check_request(p, params)
            except ValueError as e:
                raise BadRequest(str(e) if len(prompts) == 1 else f"prompt {i}: {e}") from e
        return list(await asyncio.gather(*(self._run(p, params) for p in prompts)))

    async def _run(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        try:
            result = await asyncio.wrap_future(self.engine.submit(prompt_ids, params))
        except RuntimeError as e:
            if self.engine.stopped:
                raise Unavailable("the server is shutting down") from e
            raise
        self.requests_completed += 1
        return result

    # ---- weights ---------------------------------------------------------------------------------------
    def update_from_disk(self, path: str, version: int | None) -> int:
        """Load the safetensors in directory ``path`` as ``version`` (default: the served version + 1)."""
        if not os.path.isdir(path):
            raise BadRequest(f"model_path '{path}' is not a directory")
        with self.update_lock:
            version = self.engine.version + 1 if version is None else version
            self._update(WeightUpdate(version, path=path), f"model_path '{path}'")
        return version

    def _apply_state_dict(self, state_dict: dict, version: int) -> None:
        self._update(WeightUpdate(version, state_dict=state_dict), "the broadcast weights")

    def _update(self, update: WeightUpdate, source: str) -> None:
        """``engine.update_weights`` with its failures sorted by whose they are: the request's (400, 409) or
        the server's state (503)."""
        try:
            self.engine.update_weights(update, timeout=self.update_timeout_s)
        except VersionConflict as e:
            raise Conflict(str(e)) from e
        except (FileNotFoundError, KeyError, ValueError) as e:
            raise BadRequest(f"could not load weights from {source}: {e}") from e
        except TimeoutError as e:
            raise Unavailable(str(e)) from e
        except RuntimeError as e:
            if self.engine.stopped:
                raise Unavailable("the server is shutting down") from e
            raise


def version_arg(value: str | int | None) -> int | None:
    """A request's ``weight_version``: an integer (or its decimal string) in the int64 range."""
    if value is None:
        return None
    try:
        version = int(value)
    except ValueError:
        raise BadRequest(f"weight_version must be an integer, got '{str(value)[:40]}'") from None
    if not 0 <= version <= MAX_VERSION:
        raise BadRequest(f"weight_version must lie in [0, 2**63 - 1], got {str(version)[:40]}")
    return version


# ---- start-up ---------------------------------------------------------------------------------------------
def load_state(
    model: str,
    *,
    max_slots: int = 64,
    max_len: int | None = None,
    dtype: str = "float32",
    threads: int = 1,
    interrupt_mode: str = "recompute",
    seed: int = 0,
    name: str | None = None,
    version: int = 0,
    native_kernels: bool = True,
    update_timeout_s: float = UPDATE_TIMEOUT_S,
    group_timeout_s: float = GROUP_TIMEOUT_S,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    device: str = "cpu",
) -> ServerState:
    """Load a checkpoint into a started ``LocalEngine`` and wrap it for serving. Raises ``StartupError`` (one
    line naming what to fix) for a bad path or checkpoint, or a KV cache this machine cannot hold, before
    allocating anything large."""
    import torch

    from asyncrl.models.hf import DTYPES, load_model, resolve_model_path

    try:
        path = resolve_model_path(model)
    except FileNotFoundError as e:
        raise StartupError(str(e)) from e
    shape, max_positions = _model_shape(path)
    max_len = max_len or min(max_positions, 2048)
    _check_kv_cache(shape, max_slots, max_len, DTYPES[dtype])
    torch.set_num_threads(threads)
    try:
        hf = load_model(path)
        tokenizer = _load_tokenizer_if_any(path)
        engine = LocalEngine(
            hf,
            max_slots=max_slots,
            max_len=max_len,
            dtype=DTYPES[dtype],
            seed=seed,
            interrupt_mode=interrupt_mode,
            stop_token_ids=_eos_ids(hf, tokenizer),
            threads=threads,
            tokenizer=tokenizer,
            version=version,
            native_kernels=native_kernels,
            device=device,
        )
    except Exception as e:  # noqa: BLE001 - any failure to load is a refusal to start, said in one line
        raise StartupError(f"cannot load the checkpoint in '{path}': {type(e).__name__}: {e}") from e
    del hf
    return ServerState(
        engine.start(),
        tokenizer,
        name or os.path.basename(path.rstrip("/")),
        path,
        update_timeout_s=update_timeout_s,
        group_timeout_s=group_timeout_s,
        max_request_bytes=max_request_bytes,
    )


def _model_shape(path: str):
    """The decoder shape and position limit from the checkpoint's config alone (no weights loaded yet)."""
    from transformers import AutoConfig

    from asyncrl.engine.layout import DecoderShape

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - transformers raises several types for an unreadable config
        raise StartupError(
            f"'{path}' has no readable model config (config.json): {e}; give a Hugging Face "
            "checkpoint directory or builtin:NAME"
        ) from e
    try:
        return DecoderShape.from_hf_config(config), getattr(config, "max_position_embeddings", 2048)
    except (AttributeError, ValueError) as e:
        raise StartupError(f"the model in '{path}' cannot be served by the built-in engine: {e}") from e


def kv_cache_bytes(shape, slots: int, max_len: int, dtype) -> int:
    """Bytes of the engine's KV cache (``Decoder.kv_cache``, one scratch position per slot included)."""
    import torch

    element = torch.empty((), dtype=dtype).element_size()
    return shape.n_layers * 2 * slots * shape.n_kv_heads * (max_len + 1) * shape.head_dim * element


def _check_kv_cache(shape, slots: int, max_len: int, dtype) -> None:
    need = kv_cache_bytes(shape, slots, max_len, dtype)
    memory = physical_memory()
    if memory and need > KV_MEMORY_FRACTION * memory:
        raise StartupError(
            f"--max-slots {slots} x --max-len {max_len} needs a {need / 2**30:.1f} GiB KV cache, "
            f"more than {KV_MEMORY_FRACTION:.0%} of this machine's {memory / 2**30:.1f} GiB of "
            "memory: lower --max-len or --max-slots"
        )


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _load_tokenizer_if_any(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        log.warning("no tokenizer in %s (%s): the server takes token ids only", path, e)
        return None


def _eos_ids(model, tokenizer) -> tuple[int, ...]:
    ids = getattr(model.generation_config, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
    if ids is None and tokenizer is not None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)
