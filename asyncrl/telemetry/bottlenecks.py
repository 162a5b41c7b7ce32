"""The verdict's bottleneck rules: a machine busy with other work (said first), then where a run's time goes
(trainer-bound, generator-bound, tool-bound, sync-bound, eval/checkpoint-bound, reward-bound, long-tail-bound),
each finding with the share of step time its change is expected to save (``gain``); docs/report.md lists the
rules and their thresholds."""

from __future__ import annotations

from asyncrl.telemetry.account import Account
from asyncrl.telemetry.findings import Finding, finite, now

# thresholds (fractions of the step's wall time unless said otherwise)
TRAINER_WAIT = 0.15  # the trainer waited this much for batches: generation is too slow
GATE_IDLE = 0.15  # the generator idled this much because the staleness gate was closed: training is too slow
SYNC_SHARE = 0.15  # publishing weights took this much of the trainer's time
EVAL_SAVE_SHARE = 0.15  # evaluation + checkpoints took this much of the trainer's time
TOOL_SHARE = 0.5  # episodes spent this share of their time in tools...
NOWORK_IDLE = 0.3  # ...while the generator idled this much with the gate open
REWARD_QUEUE = 1.0  # reward calls waited for a worker this many times as long as they ran...
REWARD_SHARE = 0.1  # ...rewards took this share of the step (call-seconds over wall), and the trainer waited
REWARD_BUSY = 0.25  # ...and the workers ran calls this share of the time (a burst queues without any of them busy)
LONG_TAIL = 4.0  # the longest response was this many times the mean while the trainer waited
# the share of the trainer's compute that more threads/ranks save (bench/bottlenecks.py: twice the cores cut a step
# from 12.2 s to 7.6 s)
THREADS_GAIN = 0.4


BUSY_CORES = 0.5  # processes outside the run kept this many cores busy on average: the machine was not the run's
STEAL = 0.1  # the hypervisor took this share of the machine's time


def machine_busy(steps: list[dict]) -> Finding | None:
    """The machine's load, said before the run is blamed for its speed (asyncrl.telemetry.load): its gain is the
    largest, so it heads the verdict."""
    other = [r["machine_other_cores"] for r in steps if finite(r.get("machine_other_cores")) is not None]
    steal = [r["machine_steal_frac"] for r in steps if finite(r.get("machine_steal_frac")) is not None]
    if not other:
        return None
    cores, stolen = sum(other) / len(other), sum(steal) / len(steal) if steal else 0.0
    if cores < BUSY_CORES and stolen < STEAL:
        return None
    return Finding(
        "machine busy",
        "bottleneck",
        f"processes outside the run kept {cores:.1f} cores busy on average during its steps"
        + (f", and the hypervisor took {stolen:.0%} of the machine's time (steal)" if stolen >= 0.01 else ""),
        "the step times are not the run's alone: run it alone on the machine (or give it cores of its own) before "
        "acting on the rest of this verdict",
        1.0,
    )


def bottlenecks(acc: Account, steps: list[dict], s: dict) -> list[Finding]:
    if not acc.steps or not acc.measured("trainer"):
        return []
    t, g = acc.fractions("trainer"), acc.fractions("gen")
    max_staleness = s.get("max_staleness")
    busy_machine = machine_busy(steps)
    out = [busy_machine] if busy_machine is not None else []
    busy = 1.0 - t["wait"]
    if g["idle_gate"] >= GATE_IDLE and t["wait"] < TRAINER_WAIT:
        compute = t["recompute"] + t["fwd_bwd"] + t["optim"]  # what more threads or ranks make faster
        out.append(
            Finding(
                "trainer-bound",
                "bottleneck",
                f"the generator idled {g['idle_gate']:.0%} of the time with the staleness gate closed while the "
                f"trainer was busy {busy:.0%} (waiting {t['wait']:.0%}; computing {compute:.0%})",
                _lend_cores(s, g["idle_gate"])
                + "make training faster: "
                + _more_threads(
                    s,
                    "more trainer threads (actor.threads) or ranks (actor.backend=ddp:dN)",
                    "more cores (the trainer already borrows the generator's core while it idles: "
                    "cluster.cpu_split=auto) or ranks (actor.backend=ddp:dN)",
                    "more trainer ranks (actor.backend=ddp:dN)",
                )
                + f", or fewer samples per prompt (gconfig.n_samples{now(s, 'n_samples')})"
                + (
                    f"; η >= 1 (rollout.max_head_offpolicyness) would also hide the {t['wait']:.0%} the trainer waits"
                    if max_staleness == 0 and t["wait"] > 0.02
                    else "; a larger η would not help"
                ),
                compute * THREADS_GAIN,
            )
        )
    if t["wait"] >= TRAINER_WAIT:
        lens = [(r.get("response_len_max"), r.get("response_len_mean")) for r in steps]
        tail = [mx / avg for mx, avg in lens if finite(mx) and finite(avg) and avg > 0]
        tail_ratio = sorted(tail)[len(tail) // 2] if tail else 0.0
        if tail_ratio >= LONG_TAIL:
            out.append(
                Finding(
                    "long-tail-bound",
                    "bottleneck",
                    f"the trainer waited {t['wait']:.0%} of the time; the longest response of a batch was "
                    f"{tail_ratio:.1f}x the mean (median over steps)",
                    f"let the rest of the batch go on without the long samples: raise η "
                    f"(rollout.max_head_offpolicyness{now(s, 'max_staleness')}) or cap gconfig.max_new_tokens"
                    f"{now(s, 'max_new_tokens')}",
                    t["wait"] * 0.8,
                )
            )
        elif _rewards_queue(acc, s.get("workers")):
            r = acc.seconds["reward"]
            out.append(
                Finding(
                    "reward-bound",
                    "bottleneck",
                    f"the trainer waited {t['wait']:.0%} of the time; reward calls spent "
                    f"{r['queue'] / max(1e-9, r['queue'] + r['run']):.0%} of their time waiting for a worker "
                    f"({r['queue']:.0f} call-seconds queued, {r['run']:.0f} running, over {acc.wall_s:.0f} s of wall "
                    "time)",
                    f"more reward workers (reward.workers{now(s, 'workers')})",
                    t["wait"],
                )
            )
        elif acc.measured("episode") and acc.fractions("episode")["tool"] >= TOOL_SHARE:
            out.append(
                Finding(
                    "tool-bound",
                    "bottleneck",
                    f"the trainer waited {t['wait']:.0%}; episodes spent {acc.fractions('episode')['tool']:.0%} of "
                    f"their time in tools and the generator idled {g['idle_nowork'] + g['idle_gate']:.0%} "
                    f"({g['idle_nowork']:.0%} with nothing to do, {g['idle_gate']:.0%} behind the closed gate)",
                    f"keep more episodes in flight: raise η (rollout.max_head_offpolicyness"
                    f"{now(s, 'max_staleness')}) or rollout.max_concurrent_rollouts",
                    t["wait"],
                )
            )
        elif g["idle_gate"] > 0.05 or (max_staleness is not None and max_staleness == 0):
            out.append(
                Finding(
                    "generator-bound",
                    "bottleneck",
                    f"the trainer waited {t['wait']:.0%} of the time while the staleness gate held work back "
                    f"{g['idle_gate']:.0%} (η{now(s, 'max_staleness', eq='=')})",
                    f"raise η (rollout.max_head_offpolicyness{now(s, 'max_staleness')}): generation may run "
                    "further ahead",
                    t["wait"],
                )
            )
        else:
            out.append(
                Finding(
                    "generator-bound",
                    "bottleneck",
                    f"the trainer waited {t['wait']:.0%} of the time; the generator was busy "
                    f"{g['decode'] + g['prefill'] + g['reprefill']:.0%} and the gate seldom closed, so a larger η "
                    "would not help",
                    "make generation faster: "
                    + _more_threads(
                        s,
                        "more engine threads (rollout.threads) or servers (rollout.backend=asyncrl:dN)",
                        "more engine threads (cluster.cpu_split=fixed with rollout.threads set to every "
                        "core: the shared split keeps the engine at half of them) or servers "
                        "(rollout.backend=asyncrl:dN)",
                        "more servers (rollout.backend=sglang:dN, vllm:dN)",
                    )
                    + ", or fewer tokens (gconfig.n_samples, gconfig.max_new_tokens)",
                    t["wait"],
                )
            )
    if t["sync"] >= SYNC_SHARE:
        out.append(
            Finding(
                "sync-bound",
                "bottleneck",
                f"publishing weights took {t['sync']:.0%} of the time",
                _faster_transport(s.get("transport")) + "a smaller model dtype (model.dtype=bfloat16)",
                t["sync"] * 0.9,
            )
        )  # disk -> inprocess
        # with the ~100M model saved 33% of a step whose sync was 34%
    if t["eval"] + t["save"] >= EVAL_SAVE_SHARE:
        out.append(
            Finding(
                "eval/checkpoint-bound",
                "bottleneck",
                f"evaluation took {t['eval']:.0%} and checkpoints {t['save']:.0%} of the trainer's time",
                "evaluate and save less often (evaluator.freq_steps, saver.freq_steps), on fewer items "
                "(valid_dataset.size)" + _beside(s),
                (t["eval"] + t["save"]) * 0.8,
            )
        )
    if acc.measured("episode") and not any(f.name == "tool-bound" for f in out):
        e = acc.fractions("episode")
        if e["tool"] >= TOOL_SHARE and g["idle_nowork"] >= NOWORK_IDLE:
            out.append(
                Finding(
                    "tool-bound",
                    "bottleneck",
                    f"episodes spent {e['tool']:.0%} of their time in tools and the generator idled "
                    f"{g['idle_nowork']:.0%} with nothing to do",
                    f"keep more episodes in flight: raise η (rollout.max_head_offpolicyness"
                    f"{now(s, 'max_staleness')}) or rollout.max_concurrent_rollouts",
                    g["idle_nowork"] * 0.5,
                )
            )
    return out


def _rewards_queue(acc: Account, workers=None) -> bool:
    """Reward calls waited for a worker at least as long as they ran, took a tenth of the wall time, and kept the
    ``workers`` (1 where unknown) busy a quarter of it: a group's calls arrive together, so a queue builds behind
    even a fast reward; it holds the trainer up only where the workers are busy (the default run with shared
    prefixes: calls queued 3x as long as they ran, the 2 workers busy 3% of the time, the generator 97%)."""
    if not acc.measured("reward") or not acc.wall_s:
        return False
    r = acc.seconds["reward"]
    busy = r["run"] / (acc.wall_s * (workers if isinstance(workers, int) and workers > 0 else 1))
    return (
        r["run"] > 0
        and r["queue"] >= REWARD_QUEUE * r["run"]
        and (r["queue"] + r["run"]) / acc.wall_s >= REWARD_SHARE
        and busy >= REWARD_BUSY
    )


def _lend_cores(settings: dict, idle: float) -> str:
    """On the CPU with the engine in the process and a fixed thread split, the first thing to try: the engine's
    cores sit idle behind the gate, and ``cluster.cpu_split=auto`` lends them to the trainer (the default run on
    2 cores: 2.76 -> 2.06 s a step, docs/report.md)."""
    if settings.get("cpu_split") != "fixed":
        return ""
    return f"lend the generator's idle cores ({idle:.0%} of the time) to the trainer: cluster.cpu_split=auto; or "


def _more_threads(settings: dict, fixed: str, shared: str, device: str) -> str:
    """More for one side: ``fixed`` names its threads key, ``shared`` what to do where the sides share the cores
    (and that key is not read), ``device`` off the CPU (a GPU run, as its machine.json says: threads do not help)."""
    if settings.get("device", "cpu") != "cpu":
        return device
    return shared if settings.get("cpu_split") == "auto" else fixed


def _faster_transport(transport: str | None) -> str:
    """The weight transports faster than ``transport`` (the run's ``rollout.weight_transport``, resolved)."""
    if transport == "inprocess":
        return "publish less data: "
    if transport == "dist":
        return "use "
    return (
        "use a faster weight transport (rollout.weight_transport=dist for servers; inprocess for the local engine) or "
    )


def _beside(settings: dict) -> str:
    """The evaluation and checkpoints the run does not yet do beside training (and why, where
    ``evaluator.background=auto`` kept the evaluation in the foreground)."""
    keys = [
        k
        for k, on in (
            ("evaluator.background", settings.get("eval_background")),
            ("saver.background", settings.get("save_background")),
        )
        if not on
    ]
    why = settings.get("eval_background_why")
    chose = (
        f"; evaluator.background=auto kept evaluation in the foreground: {why[len('auto: ') :]}"
        if (why and why.startswith("auto:") and not settings.get("eval_background"))
        else ""
    )
    return f", or beside training ({', '.join(k + '=true' for k in keys)}{chose})" if keys else ""
