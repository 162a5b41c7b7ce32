"""A hardware profile for the simulation, from this machine or from a run:

- ``measure``: runs the built-in engine and the trainer on the configured model, alone, with their configured
  threads, and fits the linear costs of ``asyncrl.plan.costs.Costs`` (decode steps at several batch sizes and
  context lengths, prefill per token, training per token, a weight sync through the configured transport, a
  checkpoint, a reward call), then times a full decode batch and a training step once more with the other side
  working beside them in another thread (they share the memory bandwidth); the response lengths are those the
  model writes for real prompts;
- ``fit_run``: the same costs and lengths read off a run directory's ``metrics.jsonl`` (its account).
"""

from __future__ import annotations

import copy
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from asyncrl.engine.local import LocalEngine
from asyncrl.engine.requests import NO_STOP_TOKENS
from asyncrl.plan.costs import Costs, Profile
from asyncrl.plan.lengths import Lengths, empirical, from_records
from asyncrl.telemetry.account import positions_computed
from asyncrl.types import SamplingParams, WeightUpdate


@dataclass(frozen=True)
class Fitted:
    """What a calibration found: the costs, the response lengths, and what else the workload needs."""

    profile: Profile
    lengths: Lengths
    prompt_tokens: int
    calls_per_episode: float = 1.0
    episode_tool_s: float = 0.0  # mean seconds an episode spent outside its LLM calls (agent runs)
    tool_after_last: bool = False  # episodes wait on a tool after their last LLM call too (e.g. a checker)
    fresh_calls: bool = False  # each LLM call of an episode starts a new conversation (retries, votes)
    positions_x: float = 1.0  # positions the trainer computed over those the prompts' sharing accounts for

    @property
    def tool_waits(self) -> float:
        """Tool waits per episode: one between LLM calls, and one after the last when ``tool_after_last``."""
        return max(0.0, self.calls_per_episode - 1) + self.tool_after_last

    @property
    def tool_s(self) -> float:
        """Mean seconds per tool wait."""
        return self.episode_tool_s / self.tool_waits if self.tool_waits > 0 else 0.0


def _least_squares(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Non-negative least squares by clamping (the costs are non-negative by nature)."""
    a, b = torch.tensor(rows, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    coef = torch.linalg.lstsq(a, b[:, None]).solution[:, 0]
    return [max(0.0, float(c)) for c in coef]


def _decode_points(engine: LocalEngine, prompt: list[int], batches: list[int], lengths: list[int]):
    """(running, mean context, seconds per decode step) of generations of ``b`` samples x ``n`` tokens."""
    points = []
    for n in lengths:
        for b in batches:
            params = SamplingParams(n=b, max_new_tokens=n, temperature=1.0, stop_token_ids=NO_STOP_TOKENS)
            before = engine.stats()
            engine.generate_batch([prompt], params)
            after = engine.stats()
            points.append((b, b * (len(prompt) + n / 2), (after.decode_s - before.decode_s) / n))
    return points


def measure(
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    max_slots: int,
    max_len: int,
    max_new_tokens: int,
    n_samples: int,
    temperature: float,
    stop_token_ids: tuple[int, ...],
    engine_threads: int,
    trainer_threads: int,
    make_trainer,
    publish=None,
    reward=None,
    save=None,
    eval_items: int = 0,
    name: str = "",
    trainer_most: int = 0,
) -> Fitted:
    """Measure the costs on this machine. ``make_trainer(model) -> Trainer`` builds the configured trainer on a
    copy of the model; ``publish(state_dict, version) -> seconds`` is the configured transport into an engine
    (None: in process), ``reward(text) -> float`` the configured reward, ``save(model, directory)`` a checkpoint.
    With ``trainer_most`` (the shared split: the trainer's threads while it borrows the idle engine's core), also
    how much faster training runs on that many threads than on its own (``Costs.train_borrow_x``). Decode is
    timed in this thread, which runs no other pool of workers at the same time (``asyncrl.cluster.cores``)."""
    torch.set_num_threads(engine_threads)
    engine = LocalEngine(
        copy.deepcopy(model),
        max_slots=max_slots,
        max_len=max_len,
        stop_token_ids=stop_token_ids,
        threads=engine_threads,
        seed=0,
    )
    prompt = prompts[0][: max(1, max_len // 4)]
    engine.generate_batch([prompt], SamplingParams(n=2, max_new_tokens=8, stop_token_ids=NO_STOP_TOKENS))  # warm
    batches = sorted({1, min(8, max_slots), min(32, max_slots), max_slots})
    room = max_len - len(prompt) - 1
    steps = sorted({min(room, 16), min(room, max(32, max_new_tokens))})
    points = _decode_points(engine, prompt, batches, steps)
    base, per_seq, per_ctx = _least_squares([[1.0, b, c] for b, c, _ in points], [s for _, _, s in points])
    # prefill: the engine's own counter over requests of real prompts (their first token included)
    before = engine.stats()
    sample = prompts[:16]
    engine.generate_batch(sample, SamplingParams(n=1, max_new_tokens=1, stop_token_ids=NO_STOP_TOKENS))
    prefill_per_token = (engine.stats().prefill_s - before.prefill_s) / sum(len(p) for p in sample)
    # response lengths: what the model writes for these prompts at the run's sampling
    params = SamplingParams(
        n=n_samples, max_new_tokens=max_new_tokens, temperature=temperature, stop_token_ids=stop_token_ids
    )
    outs = engine.generate_batch(prompts[:8], params)
    lengths = [len(c.output_ids) for group in outs for c in group]
    texts = [c.output_ids for group in outs for c in group]
    sync = publish(model.state_dict(), 1) if publish is not None else _in_process_sync(engine, model)
    torch.set_num_threads(trainer_threads)
    train_base, train_per_token = _train_costs(make_trainer, model, prompts, lengths, n_samples)
    train_x = 1.0
    if trainer_most > trainer_threads:  # the per-token cost with the borrowed core
        torch.set_num_threads(trainer_most)
        all_per_token = _train_costs(make_trainer, model, prompts, lengths, n_samples)[1]
        train_x = train_per_token / all_per_token if all_per_token > 0 else 1.0
        torch.set_num_threads(trainer_threads)
    # side by side: a full decode batch while the trainer steps in another thread, and a training step while
    # the engine decodes in another thread, each against the same work alone (each side at its own threads)
    trainer = make_trainer(copy.deepcopy(model))
    batch = _train_batch(prompts, lengths, n_samples, groups=8)

    def decode() -> float:
        return _decode_points(engine, prompt, [max_slots], steps[-1:])[0][2]

    def train() -> float:
        t0 = time.perf_counter()
        trainer.step(batch, version=0)
        return time.perf_counter() - t0

    train()  # warm-up
    torch.set_num_threads(engine_threads)
    decode_x = _median_of(3, lambda: _beside(decode, train, trainer_threads)) / max(1e-9, _median_of(3, decode))
    torch.set_num_threads(trainer_threads)
    train_overlap_x = _median_of(3, lambda: _beside(train, decode, engine_threads)) / max(1e-9, _median_of(3, train))
    engine.stop()
    reward_s = 0.0
    if reward is not None:
        t0 = time.perf_counter()
        for ids in texts[:32]:
            reward(tokenizer.decode(ids, skip_special_tokens=True))
        reward_s = (time.perf_counter() - t0) / max(1, min(32, len(texts)))
    save_s = 0.0
    if save is not None:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            save(model, d)
            save_s = time.perf_counter() - t0
    costs = Costs(
        decode_base_s=base,
        decode_per_seq_s=per_seq,
        decode_per_ctx_s=per_ctx,
        prefill_per_token_s=prefill_per_token,
        train_base_s=train_base,
        train_per_token_s=train_per_token,
        recompute_per_token_s=train_per_token / 3,
        sync_s=sync,
        save_s=save_s,
        reward_s=reward_s,
        train_borrow_x=train_x,
        decode_overlap_x=decode_x,
        train_overlap_x=train_overlap_x,
    )
    costs.eval_s = eval_cost(
        costs,
        eval_items,
        max_slots,
        int(statistics.mean(len(p) for p in prompts)),
        statistics.mean(lengths) if lengths else max_new_tokens,
    )
    notes = [
        f"decode steps measured at batch sizes {batches} and {steps} new tokens ({len(points)} points)",
        f"prefill over {len(sample)} prompts; training on batches of real prompt lengths and the sampled "
        f"response lengths; engine {engine_threads} thread(s), trainer {trainer_threads}, each alone",
        f"response lengths: {len(lengths)} samples of {min(8, len(prompts))} prompts at temperature {temperature}",
        f"side by side (each in its own thread): decode steps of {max_slots} sequences {decode_x:.2f}x as long "
        f"as alone while the trainer steps, a training step {train_overlap_x:.2f}x while the engine decodes",
    ]
    if trainer_most:
        notes.append(
            f"the shared split: training on {trainer_most} threads {train_x:.2f}x as fast per token as on "
            f"{trainer_threads}"
        )
    return Fitted(
        Profile(name or "measured", costs, f"measured on {_machine()}", notes),
        empirical(lengths, max_new_tokens),
        int(statistics.mean(len(p) for p in prompts)),
    )


def eval_cost(costs: Costs, items: int, slots: int, prompt: int, length: float) -> float:
    """An evaluation of ``items`` prompts, ``slots`` at a time: a prefill and ``length`` decode steps a wave."""
    waves, last = divmod(items, slots)

    def wave(n: int) -> float:
        return costs.prefill_s(n * prompt) + costs.decode_steps_s(int(length), n, n * prompt) if n else 0.0

    return waves * wave(slots) + wave(last)


def _in_process_sync(engine: LocalEngine, model) -> float:
    t0 = time.perf_counter()
    engine.update_weights(WeightUpdate(1, state_dict={k: v.detach().clone() for k, v in model.state_dict().items()}))
    return time.perf_counter() - t0


def _median_of(n: int, timed: Callable[[], float]) -> float:
    return statistics.median(timed() for _ in range(n))


def _beside(timed: Callable[[], float], work: Callable[[], object], threads: int) -> float:
    """``timed()`` while ``work()`` runs again and again in another thread on ``threads`` torch threads (from
    the end of its first round, so that both are warm)."""
    stop, warm = threading.Event(), threading.Event()

    def loop():
        torch.set_num_threads(threads)
        while not stop.is_set():
            work()
            warm.set()

    thread = threading.Thread(target=loop, name="asyncrl-profile-beside", daemon=True)
    thread.start()
    warm.wait()
    try:
        return timed()
    finally:
        stop.set()
        thread.join()


def _train_batch(prompts, lengths, n_samples, groups: int, rng: random.Random | None = None):
    """A collated batch of ``groups`` groups of real prompts and responses of the sampled lengths."""
    from asyncrl.data.collate import collate
    from asyncrl.types import Trajectory, TrajectoryGroup

    rng = rng or random.Random(0)
    batch = []
    for g in range(groups):
        prompt = prompts[g % len(prompts)]
        trajs = []
        for j in range(n_samples):
            n = rng.choice(lengths) if lengths else 8
            out = [rng.randrange(1, 100) for _ in range(max(1, n))]
            trajs.append(Trajectory(prompt, out, [-1.0] * len(out), [0] * len(out), float(j % 2)))
        batch.append(TrajectoryGroup(trajs))
    return collate(batch, pad_id=0)


def _train_costs(make_trainer, model, prompts, lengths, n_samples) -> tuple[float, float]:
    """(seconds per step, seconds per position computed) of the configured trainer, fitted on two batch sizes."""
    trainer = make_trainer(copy.deepcopy(model))
    rng = random.Random(0)
    points = []
    for groups in (2, 8):
        collated = _train_batch(prompts, lengths, n_samples, groups, rng)
        trainer.step(collated, version=0)  # warm-up (allocator, kernels)
        took = []
        for _ in range(2):  # the faster of two: a busy machine slows one step, rarely both
            t0 = time.perf_counter()
            stats = trainer.step(collated, version=0)
            took.append(time.perf_counter() - t0)
        points.append((positions_computed(stats), min(took)))
    (t1, s1), (t2, s2) = points
    slope = (s2 - s1) / (t2 - t1) if t2 > t1 else 0.0
    per_token = slope if slope > 0 else s2 / t2  # noise that hides the slope: the mean cost per token
    return max(0.0, s1 - per_token * t1), per_token


FITTED_KEYS = (
    "step_time_s", "gen_tokens_per_s", "gen_decode_s", "gen_prefill_s", "n_samples", "response_len_mean",
    "response_len_max", "train_tokens", "trainer_fwd_bwd_s", "trainer_recompute_s", "trainer_optim_s",
    "trainer_other_s", "trainer_sync_s", "trainer_eval_s", "trainer_save_s", "agent_episodes", "agent_calls",
    "episode_tool_s", "reward_calls", "reward_run_s",
)  # fmt: skip
"""The metrics a fit reads: each a number where present."""


def _check_numbers(records: list[dict]) -> None:
    for r in records:
        for key in FITTED_KEYS:
            value = r.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(
                    f"metrics.jsonl: the record of step {r.get('step')}: '{key}' must be a number, got {value!r:.40}"
                )


def fit_run(
    records: list[dict], max_new_tokens: int, group_size: int = 1, name: str = "", epochs: int = 1, passes: int = 1
) -> Fitted:
    """Costs and lengths from a run's ``metrics.jsonl`` records (``group_size``: its samples per prompt; ``epochs``:
    its passes over each batch; ``passes``: its forward passes without a gradient a step, timed together in
    ``trainer_recompute_s``): every cost is the run's own average after its first step, which warms up
    (decode per sequence-step at its occupancy, prefill per prompt token, training per token and pass, the
    proximal recompute per token, the median sync, evaluation and checkpoint)."""
    _check_numbers(records)
    every = [r for r in records if r.get("step", 0) > 0]
    if not every or "gen_decode_s" not in every[-1]:
        raise ValueError("the run's metrics have no time account (gen_decode_s): it was made by an older asyncrl")
    steps = every[1:] if len(every) > 1 else every  # the first step's allocator and kernels warm up
    before = every[0] if len(every) > 1 else {}  # the cumulative counters up to the steps read

    def total(key):
        return sum(r.get(key, 0.0) or 0.0 for r in steps)

    def median_of(key, positive=True):
        values = [r[key] for r in steps if isinstance(r.get(key), (int, float)) and (r[key] > 0 or not positive)]
        return statistics.median(values) if values else 0.0

    generated = sum(r.get("gen_tokens_per_s", 0.0) * r["step_time_s"] for r in steps)
    samples = total("n_samples")
    response = sum(r["n_samples"] * r["response_len_mean"] for r in steps)
    prompt = max(1.0, (total("train_tokens") - response) / max(1.0, samples))
    positions = sum(positions_computed(r) for r in steps)  # a shared prefix once
    per_token = total("trainer_fwd_bwd_s") / max(1.0, positions * max(1, epochs))
    recomputed = total("trainer_recompute_s") / max(1.0, positions * max(1, passes))  # one pass

    def counted(key):  # a cumulative counter over the steps read; it restarts at 0 in a resumed process
        values = [before.get(key, 0) or 0] + [r.get(key, 0) or 0 for r in steps]
        return sum(b - a if b >= a else b for a, b in zip(values, values[1:]))

    # the positions the prompts' sharing accounts for (a prompt once per group), against those computed: less than
    # 1 where completions share their first tokens too; read where prefixes were shared in single-turn runs
    shared = total("train_tokens") > positions and counted("agent_calls") == 0
    structural = prompt * samples / max(1, group_size) + response
    positions_x = min(1.0, positions / structural) if shared and structural > 0 else 1.0
    episodes = max(1, counted("agent_episodes"))
    calls, tool = counted("agent_calls") / episodes, total("episode_tool_s") / episodes
    reward_calls = counted("reward_calls")
    # single-turn: the n samples of a prompt share one prefill; an agent's every call (a sample) prefills its own
    prefills = samples if counted("agent_calls") > 0 else samples / group_size
    costs = Costs(
        decode_per_seq_s=total("gen_decode_s") / max(1.0, generated),
        prefill_per_token_s=total("gen_prefill_s") / max(1.0, prefills * prompt),
        train_base_s=(total("trainer_optim_s") + total("trainer_other_s")) / len(steps),
        train_per_token_s=per_token,
        recompute_per_token_s=recomputed or per_token / 3,
        sync_s=median_of("trainer_sync_s"),
        eval_s=median_of("trainer_eval_s"),
        save_s=median_of("trainer_save_s"),
        reward_s=total("reward_run_s") / reward_calls if reward_calls > 0 else 0.0,
    )
    notes = [
        f"fitted from {len(steps)} steps: decode {costs.decode_per_seq_s * 1e3:.3f} ms per sequence-step at the "
        f"run's occupancy, training {per_token * 1e6:.1f} us per token + {costs.train_base_s:.3f} s per step"
    ]
    return Fitted(
        Profile(name or "fitted", costs, "fitted from a run", notes),
        from_records(records, max_new_tokens),
        int(round(prompt)),
        calls if calls >= 1 else 1.0,
        tool,
        positions_x=positions_x,
    )


def _machine() -> str:
    import os

    from asyncrl.cluster.cores import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores"
