"""A discrete-event simulation of asyncrl itself: the real staleness gate and batch assembly
(``asyncrl.loop.buffer.RolloutBuffer``, driven with simulated time, and ``asyncrl.loop.staleness`` for η), with the
costs of the engines, the trainer, weight sync, evaluation, checkpoints, tools and rewards replaced by a model
(``asyncrl.plan.costs.Costs``).

What it simulates, as the system does it:
- admission: whenever the gate has room, a group starts (``n`` samples of one prompt, one request; or ``n``
  agent episodes of ``calls_per_episode`` LLM calls separated by tool latencies, and followed by one when
  ``tool_after_last``; each call continues the conversation (its prompt holds the earlier calls and tool
  results) unless ``fresh_calls``);
- engines: continuous batching over ``max_slots`` sequences each; a request is prefilled when slots are free
  (one prefill per prompt); decoding advances every running sequence a token per step (at most ``chunk``
  steps between looks at the queue); new weights land at a token boundary: running sequences are re-prefilled
  under them (``recompute``) or ended and resubmitted with their tokens so far (``abort``); the engines are held
  ``pause_s`` per update; every token is stamped with the version that produced it;
- rewards: ``reward_workers`` servers, ``reward_s`` per sample, first come first served;
- the trainer: takes B groups as soon as the buffer's rule allows, trains (``train_s`` of their tokens, times
  ``epochs``, plus the proximal recompute when asked), publishes (``sync_s``), raises the version, evaluates and
  saves when due;
- the CPU's cores (``cpu_split``): fixed, or shared as ``asyncrl.cluster.cores`` shares them: the engine keeps its
share;
  the trainer looks before each micro-batch of ``shared_mb_tokens`` and runs ``train_borrow_x`` times as fast
  while every engine is idle; alternating (η = 0): always as fast;
- the memory bandwidth the two share on one machine: an engine's decode steps are ``decode_overlap_x`` times as
  long while the trainer works, the trainer's micro-batches ``train_overlap_x`` times as long while an engine is
  busy (each looked at when the piece of work starts).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import random
import statistics
from dataclasses import dataclass, field

import numpy as np

from asyncrl.loop.buffer import RolloutBuffer
from asyncrl.loop.staleness import AutoStaleness, FixedStaleness
from asyncrl.plan.costs import Costs
from asyncrl.plan.lengths import Z99, Lengths, fixed


@dataclass(frozen=True)
class ToolLatency:
    """Seconds per tool call: log-normal with this median and 99th percentile (0: instant)."""

    median_s: float = 0.0
    p99_s: float = 0.0

    def sample(self, rng: random.Random) -> float:
        return _lognormal(rng, self.median_s, self.p99_s) if self.median_s > 0 else 0.0


def _lognormal(rng: random.Random, median: float, p99: float) -> float:
    if p99 <= median:
        return median
    return rng.lognormvariate(math.log(median), math.log(p99 / median) / Z99)


@dataclass
class Workload:
    """What one run asks of the system (the simulation's input besides the costs)."""

    batch_size: int = 16
    n_samples: int = 8
    max_staleness: int | str = 2  # or "auto"
    staleness_limit: int = 8
    prompt_tokens: int = 24
    lengths: Lengths = field(default_factory=lambda: fixed(32))
    max_slots: int = 64
    engines: int = 1
    max_concurrent: int = 0
    interrupt: str = "recompute"  # recompute | abort | drain
    steps: int = 20
    eval_every: int = 0
    save_every: int = 0
    recompute: int = 0  # forward passes without a gradient a step: proximal recompute, reference model, critic values
    epochs: int = 1
    calls_per_episode: float = 1  # agent workflows: mean LLM calls per episode (tools between them)
    tool: ToolLatency = field(default_factory=ToolLatency)
    tool_after_last: bool = False  # agent episodes end with a tool wait after their last call (e.g. a checker)
    fresh_calls: bool = False  # each call of an episode is a new conversation (the same prompt: retries, votes)
    tool_result_tokens: int = 16
    reward_workers: int = 1
    cpu_split: str = "fixed"  # fixed | shared | alternating (cluster.cpu_split=auto on the CPU, η > 0 | η = 0)
    shared_mb_tokens: int = 1024  # the trainer's micro-batches while it shares the cores (asyncrl.cluster.cores)
    shared_prefix: bool = True  # the trainer computes a group's prompt and an episode's history once
    positions_x: float = 1.0  # positions computed per position that sharing leaves (completions sharing too)
    seed: int = 0


def shared_positions(samples: list[_Seq], w: Workload) -> int:
    """Positions the trainer computes for one group's samples when it computes each shared prefix once: the
    group's prompt once, then every sample's own tokens (a call after the first adds its tool's result and its
    output to the history it shares with the call before it)."""
    follow_up = 0 if w.fresh_calls else w.tool_result_tokens
    return w.prompt_tokens + sum(s.length + (follow_up if s.prompt > w.prompt_tokens else 0) for s in samples)


@dataclass
class Prediction:
    steps: int
    total_s: float  # from the first admission to the last step's end (no step-0 evaluation), as elapsed_s
    step_time_s: float  # median of steps 2..N (the first waits for the first batch)
    mean_step_time_s: float
    steady_step_time_s: float  # mean of the last half of the steps (after the pipeline filled)
    gen_busy_frac: float  # engines' generating time over the wall time (mean over engines)
    trainer_wait_frac: float
    staleness_mean: float
    staleness_hist: dict[int, int]  # staleness -> trained tokens
    tokens_per_s: float  # generated tokens per wall second
    trained_tokens_per_s: float
    max_staleness: list[int]  # η in force at each step
    step_times: list[float]
    positions_per_step: float = 0.0  # positions the trainer computes a step (a shared prefix once)

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "total_s": self.total_s,
            "step_time_s": self.step_time_s,
            "mean_step_time_s": self.mean_step_time_s,
            "steady_step_time_s": self.steady_step_time_s,
            "gen_busy_frac": self.gen_busy_frac,
            "trainer_wait_frac": self.trainer_wait_frac,
            "staleness_mean": self.staleness_mean,
            "staleness_hist": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "tokens_per_s": self.tokens_per_s,
            "trained_tokens_per_s": self.trained_tokens_per_s,
            "max_staleness": self.max_staleness,
            "positions_per_step": self.positions_per_step,
        }


# ---- the pieces --------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Seq:
    request: "_Request"
    length: int  # tokens it will generate
    prompt: int
    versions: collections.Counter = field(default_factory=collections.Counter)  # version -> tokens

    @property
    def context(self) -> int:
        return self.prompt + self.length


@dataclass(eq=False)
class _Request:
    prompt: int
    seqs: list[_Seq]
    done: callable
    open: int = 0


@dataclass(eq=False)
class _Group:
    ticket: object
    samples: list[_Seq] = field(default_factory=list)
    episodes_left: int = 0


class _Engine:
    """One engine's running sequences as arrays (tokens left, context, tokens generated in the current version)
    beside the sequence objects, so that a chunk of decode steps costs a few array operations."""

    def __init__(self, sim: "Simulation", index: int):
        self.sim, self.index = sim, index
        self.waiting: collections.deque[_Request] = collections.deque()
        self.seqs = np.empty(0, dtype=object)  # the running _Seq objects
        self.rem = np.zeros(0, dtype=np.int64)
        self.ctx = np.zeros(0, dtype=np.int64)
        self.gen = np.zeros(0, dtype=np.int64)  # generated under the current version
        self.busy = False
        self.version = 0
        self.pending: int | None = None
        self.busy_s = self.tokens = 0.0
        self.load = 0  # sequences running or waiting (routing reads it)
        self.idle_from: float | None = 0.0  # since when it has had nothing to do (None: working)

    def submit(self, request: _Request) -> None:
        """Queue a request; the engine looks at its queue once the admissions of this moment are done (as the
        real one does at its next token boundary)."""
        self.waiting.append(request)
        self.load += len(request.seqs)
        self.sim.at(self.sim.t, self.kick)

    def _close_version(self) -> None:
        """Credit the tokens generated under the current version to it (before the version changes)."""
        for s, n in zip(self.seqs.tolist(), self.gen.tolist()):
            if n:
                s.versions[self.version] += n
        self.gen[:] = 0

    def kick(self) -> None:
        if self.busy:
            return
        if not (self.waiting or len(self.seqs) or self.pending is not None):
            self.idle_from = self.sim.t if self.idle_from is None else self.idle_from
            return
        sim, costs = self.sim, self.sim.costs
        cost, held = 0.0, 0.0
        if self.pending is not None:  # new weights at this token boundary
            self._close_version()
            self.version, self.pending = self.pending, None
            # the engine was held for pause_s within the sync that just ended: what of it the engine spent idle
            # anyway (a synchronous run waiting for the weights) costs nothing more
            idle = min(sim.t - self.idle_from, costs.sync_s) if self.idle_from is not None else 0.0
            held = max(0.0, costs.pause_s - idle)
            if len(self.seqs) and sim.w.interrupt in ("recompute", "abort"):  # re-prefilled (or resubmitted) under them
                cost += costs.prefill_s(int(self.ctx.sum()))
        free = sim.w.max_slots - len(self.seqs)
        admitted, new = 0, []
        while self.waiting and len(self.waiting[0].seqs) <= free:
            request = self.waiting.popleft()
            free -= len(request.seqs)
            admitted += request.prompt
            new.extend(request.seqs)
        if new:
            objects = np.empty(len(new), dtype=object)
            objects[:] = new
            self.seqs = np.concatenate([self.seqs, objects])
            self.rem = np.concatenate([self.rem, [s.length for s in new]])
            self.ctx = np.concatenate([self.ctx, [s.prompt for s in new]])
            self.gen = np.concatenate([self.gen, np.zeros(len(new), dtype=np.int64)])
        cost += costs.prefill_s(admitted)
        steps = 0
        if len(self.seqs):
            steps = int(min(self.rem.min(), sim.chunk))
            cost += costs.decode_steps_s(steps, len(self.seqs), int(self.ctx.sum()))
            cost *= costs.decode_overlap_x if sim.trainer_busy else 1.0
        self.busy, self.idle_from = True, None
        self.busy_s += cost
        sim.at(sim.t + held + cost, lambda: self._step_done(steps))

    @property
    def idle(self) -> bool:
        """Nothing running or waiting (as ``LocalEngine.idle``)."""
        return not self.waiting and not len(self.seqs)

    def _step_done(self, steps: int) -> None:
        self.busy = False
        if steps:
            self.rem -= steps
            self.ctx += steps
            self.gen += steps
            self.tokens += steps * len(self.seqs)
            done = np.nonzero(self.rem <= 0)[0]
            if len(done):
                finished = self.seqs[done].tolist()
                for s, n in zip(finished, self.gen[done].tolist()):
                    s.versions[self.version] += n
                keep = self.rem > 0
                self.seqs, self.rem, self.ctx, self.gen = (
                    self.seqs[keep],
                    self.rem[keep],
                    self.ctx[keep],
                    self.gen[keep],
                )
                self.load -= len(finished)
                for s in finished:
                    s.request.open -= 1
                    if s.request.open == 0:
                        s.request.done()
        self.kick()


class Simulation:
    def __init__(self, workload: Workload, costs: Costs, chunk: int = 16):
        self.w, self.costs, self.chunk = workload, costs, chunk
        self.t = 0.0
        self.rng = random.Random(workload.seed)
        self._events: list = []
        self._seq = itertools.count()
        policy = (
            AutoStaleness(workload.staleness_limit)
            if workload.max_staleness == "auto"
            else FixedStaleness(int(workload.max_staleness))
        )
        self.policy = policy
        self.buffer = RolloutBuffer(workload.batch_size, policy, workload.max_concurrent, clock=lambda: self.t)
        self.engines = [_Engine(self, i) for i in range(workload.engines)]
        self.reward_free = [0.0] * max(1, workload.reward_workers)
        self.version = 0
        self.trainer_busy = False  # training, syncing, evaluating or saving (the machine's other user)
        self.idle_since = 0.0
        self.wait_s = 0.0
        self.steps: list[dict] = []
        self.last_record = 0.0
        self.last_gate = 0.0
        self.away = {"trainer_eval_s": 0.0, "trainer_save_s": 0.0}  # after the last publish: in the next record
        self.hist: collections.Counter = collections.Counter()
        self.trained_tokens = 0
        self.trained_positions = 0.0

    # ---- the event queue -------------------------------------------------------------------------------------
    def at(self, t: float, fn) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn))

    def run(self) -> Prediction:
        self._admit()
        while self._events and len(self.steps) < self.w.steps:
            t, _, fn = heapq.heappop(self._events)
            self.t = max(self.t, t)
            fn()
        return self._prediction()

    # ---- the rollout side --------------------------------------------------------------------------------------
    def _admit(self) -> None:
        while (ticket := self.buffer.try_admit()) is not None:
            group = _Group(ticket)
            if self.w.calls_per_episode <= 1 and not self.w.tool_after_last:
                self._single_turn(group)
            else:
                group.episodes_left = self.w.n_samples
                mean = self.w.calls_per_episode
                for _ in range(self.w.n_samples):  # a whole number of calls each, the given mean over episodes
                    calls = int(mean) + (self.rng.random() < mean - int(mean))
                    self._call(group, self.w.prompt_tokens, calls)

    def _engine(self) -> _Engine:
        return min(self.engines, key=lambda e: e.load)

    def _single_turn(self, group: _Group) -> None:
        seqs = []
        request = _Request(self.w.prompt_tokens, seqs, lambda: self._scored(group))
        for _ in range(self.w.n_samples):
            seqs.append(_Seq(request, self.w.lengths.sample(self.rng), self.w.prompt_tokens))
        request.open = len(seqs)
        group.samples = seqs
        self._engine().submit(request)

    def _call(self, group: _Group, prompt: int, calls_left: int) -> None:
        """One LLM call of an agent episode; then a tool and the next call, or the episode ends (after a last
        tool wait when ``tool_after_last``)."""
        n = self.w.lengths.sample(self.rng)
        request = _Request(prompt, [], lambda: None)
        seq = _Seq(request, n, prompt)
        request.seqs, request.open = [seq], 1
        group.samples.append(seq)

        def answered() -> None:
            if calls_left > 1:
                wait = self.w.tool.sample(self.rng)
                follow = prompt if self.w.fresh_calls else prompt + n + self.w.tool_result_tokens
                self.at(self.t + wait, lambda: self._call(group, follow, calls_left - 1))
                return
            if self.w.tool_after_last:
                self.at(self.t + self.w.tool.sample(self.rng), ended)
            else:
                ended()

        def ended() -> None:
            group.episodes_left -= 1
            if group.episodes_left == 0:
                self._scored(group)

        request.done = answered
        self._engine().submit(request)

    def _scored(self, group: _Group) -> None:
        """Each sample's reward on the first free reward worker; the group is finished with the last."""
        end = self.t
        for _ in group.samples:
            if self.costs.reward_s <= 0:
                break
            i = min(range(len(self.reward_free)), key=self.reward_free.__getitem__)
            start = max(self.t, self.reward_free[i])
            self.reward_free[i] = start + self.costs.reward_s
            end = max(end, self.reward_free[i])
        self.at(end, lambda: self._finish(group))

    def _finish(self, group: _Group) -> None:
        self.buffer.finish(group.ticket, group)
        self._admit()
        self._train()

    # ---- the trainer ---------------------------------------------------------------------------------------------
    def _train(self) -> None:
        if self.trainer_busy or len(self.steps) >= self.w.steps:
            return
        batch = self.buffer.try_take()
        if batch is None:
            return
        self.wait_s += self.t - self.idle_since
        self.trainer_busy = True
        samples = [s for g in batch for s in g.samples]
        tokens = sum(s.context for s in samples)  # prompt + response of every sample (agent: every call)
        for s in samples:
            for v, n in s.versions.items():
                self.hist[self.version - v] += n
        self.trained_tokens += tokens
        positions = tokens
        if self.w.shared_prefix:
            positions = self.w.positions_x * sum(shared_positions(g.samples, self.w) for g in batch)
        self.trained_positions += positions
        train = self.costs.train_s(positions, self.w.recompute, self.w.epochs)
        varies = self.w.cpu_split == "shared" or self.costs.train_overlap_x != 1.0  # speed read per piece
        chunks = min(64, math.ceil(positions * self.w.epochs / self.w.shared_mb_tokens)) if varies else 1
        self._train_chunks(max(1, chunks), train / max(1, chunks))

    def _train_chunks(self, left: int, each_s: float) -> None:
        """The step's micro-batches (pieces of it) one at a time, each at the speed it has when it starts."""
        if left == 0:
            self.at(self.t + self.costs.sync_s, self._published)
            return
        each = each_s / _faster(self.costs.train_borrow_x, self.trainer_borrows())
        each *= self.costs.train_overlap_x if any(not e.idle for e in self.engines) else 1.0
        self.at(self.t + each, lambda: self._train_chunks(left - 1, each_s))

    def trainer_borrows(self) -> bool:
        """Whether the trainer has the engine's idle core now (``asyncrl.cluster.cores``)."""
        split = self.w.cpu_split
        return split == "alternating" or (split == "shared" and all(e.idle for e in self.engines))

    def _published(self) -> None:
        self.version += 1
        # the trainer's work after the sync, an evaluation and a checkpoint, is in the next step's record, as the
        # loop's account books it (auto η does not read a step spent mostly on them)
        away = self.away
        self.away = {
            "trainer_eval_s": self.costs.eval_s if self.w.eval_every and self.version % self.w.eval_every == 0 else 0.0,
            "trainer_save_s": self.costs.save_s if self.w.save_every and self.version % self.w.save_every == 0 else 0.0,
        }
        extra = sum(self.away.values())
        for e in self.engines:
            e.pending = self.version
        self.buffer.set_version(self.version)
        gate = self.buffer.gate_closed_s()
        record = {
            "step": self.version,
            "step_time_s": self.t - self.last_record,
            "trainer_wait_s": self.wait_s,
            "gate_closed_s": gate - self.last_gate,
            "max_staleness": self.buffer.max_staleness,
            **away,
        }
        self.steps.append(record)
        self.policy.observe(record)
        self.last_record, self.last_gate, self.wait_s = self.t, gate, 0.0
        self.at(self.t + extra, self._trainer_free)  # at once when nothing follows: it takes its next batch (if
        self.at(self.t, self._admit)  # ready) before the engines go on, so they see whether it works beside them
        for e in self.engines:
            self.at(self.t, e.kick)

    def _trainer_free(self) -> None:
        self.trainer_busy = False
        self.idle_since = self.t
        self._train()

    # ---- the result --------------------------------------------------------------------------------------------
    def _prediction(self) -> Prediction:
        steps = self.steps
        wall = sum(r["step_time_s"] for r in steps) or 1e-9
        times = [r["step_time_s"] for r in steps]
        later = times[1:] or times
        tokens = sum(self.hist.values())
        return Prediction(
            steps=len(steps),
            total_s=wall,
            step_time_s=statistics.median(later) if later else 0.0,
            mean_step_time_s=sum(later) / len(later) if later else 0.0,
            steady_step_time_s=statistics.mean(times[len(times) // 2 :]) if times else 0.0,
            gen_busy_frac=min(1.0, sum(e.busy_s for e in self.engines) / len(self.engines) / wall),
            trainer_wait_frac=sum(r["trainer_wait_s"] for r in steps) / wall,
            staleness_mean=sum(k * v for k, v in self.hist.items()) / tokens if tokens else 0.0,
            staleness_hist=dict(self.hist),
            tokens_per_s=sum(e.tokens for e in self.engines) / wall,
            trained_tokens_per_s=self.trained_tokens / wall,
            max_staleness=[r["max_staleness"] for r in steps],
            step_times=times,
            positions_per_step=self.trained_positions / len(steps) if steps else 0.0,
        )


def _faster(x: float, borrowing: bool) -> float:
    """How many times faster work runs now: ``x`` with the borrowed core, else 1."""
    return x if borrowing and x > 0 else 1.0


def simulate(workload: Workload, costs: Costs, chunk: int = 16) -> Prediction:
    """Run the simulation of ``workload`` under ``costs`` to its ``steps``."""
    return Simulation(workload, costs, chunk).run()
