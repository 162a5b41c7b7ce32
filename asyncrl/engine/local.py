"""The built-in inference engine: in-process PyTorch, continuous batching, interruptible by weight updates.

Requests wait in a queue; at every token boundary the engine loop (1) applies a pending weight update or
abort, (2) admits waiting requests into free KV slots (one prefill per prompt, copied to its ``n`` samples),
(3) decodes one token for every running sequence and (4) retires finished ones, compacting the slots.

On a weight update, running sequences are re-prefilled under the new weights (``interrupt_mode=
"recompute"``) so their KV cache matches the new model, and decoding continues: a sequence that spans the
update carries both versions in ``Completion.versions``. ``"abort"`` ends them with finish reason
``abort`` instead, and the caller may resubmit prompt + partial output. ``abort()`` does the same on demand
(a server's ``/pause_generation``); ``generate`` continues such samples itself (all samples of a group at
once), so its callers only ever see finished samples.

The loop runs in its own thread (``start``), or in the caller's thread (``generate_batch`` and
``run_until_idle``, for tests and tools).

``device`` (default the CPU) holds the weights, the KV cache, the sampler's buffers and its generator; per
step the engine copies the step's token ids and positions to it in one asynchronous copy and reads the
sampled tokens and log-probs back once. On a device other than the CPU the native kernels are off (they are
CPU code) and weight updates are copied from wherever their tensors are straight into the device. On a CUDA
device the engine queues its work on a stream of its own: its read per step waits for its own kernels only,
never for those of a trainer sharing the GPU (which run beside them). ``update_weights`` finishes the copies
on the caller's stream before handing the weights over, and the set it writes into was retired at a token
boundary, after the engine's last read, so no kernel of the engine can still be reading it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from concurrent.futures import Future
from typing import Callable

import torch

from asyncrl.api.engine import EngineStats
from asyncrl.cluster.cores import use_threads
from asyncrl.engine.continuation import continue_all
from asyncrl.engine.decoder import Decoder, resolve_device
from asyncrl.engine.layout import Weights
from asyncrl.engine.phases import PhaseClock
from asyncrl.engine.requests import (
    CPU,
    INTERRUPT_MODES,
    MAX_VERSION,
    PendingUpdate,
    Request,
    SampleState,
    VersionConflict,
    check_request,
    ends_with_stop_string,
    settle,
    state_dict_of,
)
from asyncrl.engine.sampling import RowParams, on_host, sample_rows, seeded_uniforms
from asyncrl.types import Completion, SamplingParams, WeightUpdate


class LocalEngine:
    """Continuous-batching engine over a ``Decoder``. Thread-safe entry points: ``submit``, ``generate``,
    ``update_weights``, ``pause``, ``resume``, ``abort``, ``stats``, ``stop``."""

    def __init__(
        self,
        model,
        max_slots: int = 64,
        max_len: int = 512,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        interrupt_mode: str = "recompute",
        stop_token_ids: tuple[int, ...] = (),
        version: int = 0,
        recompute_chunk: int = 16,
        threads: "int | Callable[[], int] | None" = None,
        tokenizer=None,
        native_kernels: bool = True,
        device: torch.device | str | None = None,
    ):
        if interrupt_mode not in INTERRUPT_MODES:
            raise ValueError(f"interrupt_mode must be one of {INTERRUPT_MODES}, got '{interrupt_mode}'")
        self.device = resolve_device(device)
        self.decoder = Decoder(model, max_slots, max_len, dtype, native_kernels, device=self.device)
        self.weight_shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}  # what updates hold
        self.max_slots, self.max_len = max_slots, max_len
        self.interrupt_mode = interrupt_mode
        self.default_stop = tuple(stop_token_ids)
        self.recompute_chunk = recompute_chunk
        self.threads = threads  # torch threads of the engine thread (a callable: asked before each step)
        self.tokenizer = tokenizer  # only needed for stop strings
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if self._stream is not None:  # the weights and the cache were just written on the caller's stream
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        self._version = version
        self._waiting: collections.deque[Request] = collections.deque()
        self._active: list[SampleState] = []
        self._rows: RowParams | None = None  # sampling parameters of _active, rebuilt when it changes
        self._scratch: torch.Tensor | None = None  # the sampler's (slots, V) buffer
        self._update: PendingUpdate | None = None
        self._abort = False
        self._paused = False
        self._stopped = False
        self._cv = threading.Condition()
        self._update_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.clock = PhaseClock()  # where the loop's time goes, and the counters

    # ---- public API ----------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return self.decoder.shape.vocab

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Future:
        """Queue a prompt; the future resolves to ``params.n`` completions, some of which may end with
        ``abort`` (a weight update in abort mode, or ``abort()``). Stop strings (``params.stop``) end a
        sample once its decoded output contains one (needs ``tokenizer``). Cancelling the future (as a
        cancelled ``asyncio.wrap_future`` of it does) drops the request: it is not started, or its samples
        leave their slots at the next token boundary."""
        self.check_request(prompt_ids, params)
        req = Request(list(prompt_ids), params, Future())
        with self._cv:
            if self._stopped:
                raise RuntimeError("engine is stopped")
            self._waiting.append(req)
            self._cv.notify_all()
        return req.future

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError with the reason if this engine cannot serve the request."""
        check_request(
            prompt_ids,
            params,
            max_slots=self.max_slots,
            max_len=self.max_len,
            vocab=self.decoder.shape.vocab,
            has_tokenizer=self.tokenizer is not None,
        )

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """``params.n`` finished samples; samples cut short by an abort are continued concurrently."""
        first = await asyncio.wrap_future(self.submit(prompt_ids, params))
        return await continue_all(first, params, self._generate_one)

    async def _generate_one(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        (c,) = await asyncio.wrap_future(self.submit(prompt_ids, params))
        return c

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """Generate for many prompts and wait (in this thread if the loop is not running); samples are
        returned as the engine ended them (an abort is not continued)."""
        futures = [self.submit(p, params) for p in prompts]
        if self._thread is None:
            self.run_until_idle()
        return [f.result() for f in futures]

    def update_weights(self, update: WeightUpdate, timeout: float | None = 60.0) -> None:
        """Install new weights at the next token boundary; returns once they serve all later tokens.

        The new weights are converted here, in the caller's thread (the engine keeps decoding meanwhile);
        the swap itself is a pointer change at a token boundary, so no token is ever computed by a
        half-loaded model. In-flight sequences are then re-prefilled (or aborted) by the engine loop before
        it decodes again."""
        with self._update_lock:  # one update at a time, in call order
            if self._stopped:
                raise RuntimeError(f"engine is stopped; weight update to version {update.version} not applied")
            self._check_version(update.version)  # before the (long) conversion
            try:
                weights = self.decoder.prepare(state_dict_of(update))
            except Exception as e:
                e.add_note(f"while preparing the weights of version {update.version} (the old weights keep serving)")
                raise
            if self._stream is not None:  # the copies ran on this thread's stream: done before the hand-over
                torch.cuda.current_stream(self.device).synchronize()
            if self._thread is None:
                while self.interrupt_mode == "drain" and self._active:
                    self.step(admit=False)
                self.clock.enter("paused_s")
                self._install(update.version, weights)
                self._interrupt_running()
                self.clock.enter(None)
                return
            pending = PendingUpdate(update.version, weights)
            with self._cv:
                self._update = pending
                self._cv.notify_all()
            deadline = None if timeout is None else time.monotonic() + timeout
            while not pending.applied.wait(0.05):
                if self._stopped:
                    raise RuntimeError(f"engine stopped; weight update to version {update.version} not applied")
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"weight update to version {update.version} not applied within {timeout}s")
            if isinstance(pending.error, VersionConflict):
                raise pending.error
            if pending.error is not None:
                raise RuntimeError(
                    f"installing the weights of version {update.version} failed: "
                    f"{type(pending.error).__name__}: {pending.error}"
                ) from pending.error

    def _check_version(self, version: int) -> None:
        """Versions are int64 and never decrease; the same version may be loaded again (a retried publish)."""
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
            raise ValueError(f"weight version must be an integer in [0, 2**63 - 1], got {str(version)[:40]}")
        if version < self._version:
            raise VersionConflict(
                f"weight version {version} is below the version {self._version} being served: versions never decrease"
            )

    def pause(self) -> None:
        """Stop decoding at the next token boundary; in-flight requests keep their state."""
        with self._cv:
            self._paused = True

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def abort(self) -> None:
        """End every running sample at the next token boundary with finish reason ``abort`` (queued
        requests stay queued). Returns at once; without a loop thread, applies immediately."""
        if self._thread is None:
            self._abort_running()
            return
        with self._cv:
            self._abort = True
            self._cv.notify_all()

    def start(self) -> "LocalEngine":
        self._thread = threading.Thread(target=self._loop, name="asyncrl-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the loop; waiting and running requests fail with "engine stopped". Safe to call from several
        threads at once (a server stops it on SIGTERM and again on its way out)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join()
        self._thread = None
        self._fail_all(RuntimeError("engine stopped"))

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def started(self) -> bool:
        """Whether the loop runs in a thread of its own (else ``generate_batch`` runs it in the caller's)."""
        return self._thread is not None

    def stats(self) -> EngineStats:
        """The counters now (:class:`asyncrl.engine.phases.PhaseClock`: every moment of the loop in one phase)."""
        return self.clock.read()

    @property
    def n_running(self) -> int:
        with self._cv:  # the engine thread pops from the queue meanwhile
            waiting = list(self._waiting)
        return len(self._active) + sum(not r.future.cancelled() for r in waiting)

    @property
    def paused(self) -> bool:
        return self._paused

    # ---- the loop ------------------------------------------------------------------------------------
    def _on_stream(self):
        """The engine's CUDA stream as the current one (nothing elsewhere)."""
        return contextlib.nullcontext() if self._stream is None else torch.cuda.stream(self._stream)

    @property
    def idle(self) -> bool:
        """Whether the engine's loop is waiting for work (or paused) now."""
        return self.clock.phase == "idle_s" or self._paused

    def _set_threads(self) -> None:
        use_threads(self.threads() if callable(self.threads) else self.threads)

    def _loop(self) -> None:
        self._set_threads()
        with self._on_stream():
            self._run_loop()

    def _run_loop(self) -> None:
        """Wait for work, then apply a weight update or an abort, or take one step. Every moment is counted
        (``clock.enter``): waiting (for the lock too) as idle or paused, a weight update or an abort as paused, a step
        as its prefill and decode."""
        while True:
            self.clock.enter("paused_s" if self._paused else "idle_s")
            with self._cv:
                while not (self._stopped or self._update or self._abort) and (
                    self._paused or not (self._waiting or self._active)
                ):
                    self._cv.wait()
                if self._stopped:
                    self.clock.enter(None)
                    return
                # drain (non-interruptible generation, for ablations): a pending update waits until every
                # running sequence has finished, and no new request starts meanwhile
                draining = self._update is not None and self.interrupt_mode == "drain" and bool(self._active)
                pending = None if draining else self._update
                if not draining:
                    self._update = None
                abort, self._abort = self._abort, False
            self.clock.enter("decode_s" if pending is None and not abort else "paused_s")
            if pending is not None:
                try:
                    self._install(pending.version, pending.weights)
                except Exception as e:  # noqa: BLE001 - reported to the caller of update_weights
                    pending.error = e
                pending.applied.set()  # later tokens use the new weights: the caller may go on
            try:
                if pending is not None and pending.error is None:
                    self._interrupt_running()
                if abort:
                    self.clock.enter("paused_s")
                    self._abort_running()
                if pending is None and not abort:
                    self._set_threads()
                    self.step(admit=not draining)
            except Exception as e:  # noqa: BLE001 - a failing step fails its requests, never the engine
                self._fail_all(e)

    def run_until_idle(self) -> None:
        """Run the loop in the calling thread until no request is waiting or running."""
        while self._waiting or self._active:
            self._set_threads()  # as the loop does: a callable ``threads`` is asked before each step
            self.step()
        self.clock.enter(None)

    @torch.inference_mode()
    def step(self, admit: bool = True) -> None:
        """One token boundary: admit waiting requests, then decode one token for every running sequence."""
        with self._on_stream():
            self._step(admit)

    def _step(self, admit: bool) -> None:
        self.clock.enter("prefill_s")
        if admit:
            self._admit()
        self.clock.enter("decode_s")
        if self._active:
            seqs, cpu = self._active, CPU  # token ids and positions on the host (the decoder moves them)
            tokens = torch.tensor([s.tokens[-1] for s in seqs], device=cpu)[:, None]
            start = torch.tensor([s.cached for s in seqs], device=cpu)
            logits = self.decoder.forward(tokens, 0, start, torch.ones(len(seqs), dtype=torch.long, device=cpu))
            if self._rows is None:
                self._rows = RowParams.of([s.req.params for s in seqs], self.device)
            self._sample_into(seqs, logits, self._rows)
            self._retire()

    def _admit(self) -> None:
        new: list[Request] = []
        free = self.max_slots - len(self._active)
        with self._cv:
            while self._waiting and (self._waiting[0].future.cancelled() or self._waiting[0].params.n <= free):
                req = self._waiting.popleft()
                if req.future.cancelled():  # its caller stopped waiting before it started
                    continue
                free -= req.params.n
                req.queued_s = time.perf_counter() - req.submitted
                new.append(req)
        if not new:
            return
        base, cpu = len(self._active), CPU
        lengths = torch.tensor([len(r.prompt_ids) for r in new], device=cpu)
        tokens = torch.zeros(len(new), int(lengths.max()), dtype=torch.long, device=cpu)
        for i, r in enumerate(new):
            tokens[i, : len(r.prompt_ids)] = torch.tensor(r.prompt_ids, device=cpu)
        logits = self.decoder.forward(tokens, base, torch.zeros(len(new), dtype=torch.long, device=cpu), lengths)
        # one prefill row per prompt sits in slots base..base+len(new); copies for the other samples follow
        seqs: list[SampleState] = [SampleState(r, 0, list(r.prompt_ids)) for r in new]
        rows = list(range(len(new)))
        for i, r in enumerate(new):
            first = base + len(seqs)
            self.decoder.copy_slot(base + i, range(first, first + r.params.n - 1), len(r.prompt_ids))
            seqs += [SampleState(r, j, list(r.prompt_ids)) for j in range(1, r.params.n)]
            rows += [i] * (r.params.n - 1)
        self._active.extend(seqs)
        self._rows = None
        index = torch.tensor(rows, device=cpu)
        if index.device != logits.device:
            index = index.to(logits.device, non_blocking=True)
        self._sample_into(seqs, logits[index], RowParams.of([s.req.params for s in seqs], self.device))
        self._retire()

    def _sample_into(self, seqs: list[SampleState], logits: torch.Tensor, rows: RowParams) -> None:
        kernels = self.decoder.kernels
        if self._scratch is None and (kernels is not None or not rows.all_greedy):
            self._scratch = torch.empty(self.max_slots, self.decoder.shape.vocab, device=self.device)
        seeds = None if rows.all_greedy else [s.draw_seed for s in seqs]  # greedy rows draw nothing
        u = seeded_uniforms(seeds, [len(s.tokens) for s in seqs], self.generator, self.device)
        tokens, logprobs = on_host(*sample_rows(logits, rows, self.generator, self._scratch, kernels, u))
        version = self._version
        for s, t, lp in zip(seqs, tokens, logprobs):
            s.tokens.append(t)
            s.output_ids.append(t)
            s.logprobs.append(lp)
            s.versions.append(version)
        self.clock.count(generated_tokens=len(seqs))

    def _retire(self) -> None:
        """Finish sequences that hit a stop token or string or their length limit; keep slots contiguous."""
        for i in range(len(self._active) - 1, -1, -1):
            s = self._active[i]
            p = s.req.params
            if s.req.future.cancelled():  # its caller stopped waiting: free the slot
                reason = "abort"
            elif s.output_ids[-1] in (p.stop_token_ids or self.default_stop):
                reason = "stop"
            elif p.stop and ends_with_stop_string(self.tokenizer, s.tokens[s.output_start :], p.stop):
                reason = "stop"
            elif len(s.output_ids) >= p.max_new_tokens or len(s.tokens) >= self.max_len:
                reason = "length"
            else:
                continue
            self._finish(i, reason)

    def _finish(self, i: int, reason: str) -> None:
        s = self._active[i]
        last = len(self._active) - 1
        if i != last:
            moved = self._active[last]
            self.decoder.copy_slot(last, range(i, i + 1), moved.cached)
            self._active[i] = moved
        self._active.pop()
        self._rows = None
        req = s.req
        req.done.append(
            (s.index, Completion(req.prompt_ids, s.output_ids, s.logprobs, s.versions, reason, req.queued_s))
        )
        if len(req.done) == req.params.n:
            settle(req.future, [c for _, c in sorted(req.done, key=lambda d: d[0])])

    def _install(self, version: int, weights: Weights) -> None:
        self._check_version(version)  # again at the swap: an update that timed out may have landed since
        self.decoder.install(weights)
        self._version = version

    @torch.inference_mode()
    def _interrupt_running(self) -> None:
        """After new weights: re-prefill every running sequence under them, or abort them."""
        if not self._active:
            return
        with self._on_stream():
            self._interrupt_on_stream()

    def _interrupt_on_stream(self) -> None:
        self.clock.count(interruptions=1)
        if self.interrupt_mode == "abort":
            self._abort_running()
            return
        self.clock.enter("reprefill_s")
        cpu = CPU
        for a in range(0, len(self._active), self.recompute_chunk):
            chunk = self._active[a : a + self.recompute_chunk]
            lengths = torch.tensor([s.cached for s in chunk], device=cpu)
            tokens = torch.zeros(len(chunk), int(lengths.max()), dtype=torch.long, device=cpu)
            for i, s in enumerate(chunk):
                tokens[i, : s.cached] = torch.tensor(s.tokens[:-1], device=cpu)
            self.decoder.forward(tokens, a, torch.zeros(len(chunk), dtype=torch.long, device=cpu), lengths)
        self.clock.enter("paused_s")

    def _abort_running(self) -> None:
        with self._on_stream():  # finishing compacts the slots (cache copies)
            for i in range(len(self._active) - 1, -1, -1):
                self._finish(i, "abort")

    def _fail_all(self, error: Exception) -> None:
        with self._cv:
            reqs = list(self._waiting) + [s.req for s in self._active]
            self._waiting.clear()
        self._active = []
        self._rows = None
        for r in reqs:
            settle(r.future, error=error)
