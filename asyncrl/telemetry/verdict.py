"""The verdict on a run: data -> rules -> words. ``diagnose(records)`` is a pure function from a run's
metrics records to findings, each with its name, the evidence (the numbers it read) and the one change it
suggests; the console, ``report.html`` and ``asyncrl diagnose`` only render them (docs/report.md lists every
rule, its thresholds and how to act on it).

Two kinds of findings:
- **bottlenecks** (where the time goes; at most one is *the* bottleneck, the one whose fix is expected to save
  the most step time, ``gain``): trainer-bound, generator-bound, tool-bound, sync-bound, eval/checkpoint-bound,
  reward-bound, long-tail-bound;
- **learning health**: no learning signal, entropy collapse, clipping, the behaviour-weight cap, truncation,
  train/inference mismatch, staleness at its bound, held-out accuracy falling from its best; for SFT, memorising
  (training loss near zero while held-out accuracy stays low).

Rules read the last ``WINDOW`` training steps (the run as it ends, or as it is now), never the first (which waits
for the first batch whatever the settings), so a warm-up does not decide the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from asyncrl.telemetry.account import Account, account

WINDOW = 20
"""Training steps the rules read (the last ones)."""

# thresholds (fractions of the step's wall time unless said otherwise)
TRAINER_WAIT = 0.15  # the trainer waited this much for batches: generation is too slow
GATE_IDLE = 0.15  # the generator idled this much because the staleness gate was closed: training is too slow
SYNC_SHARE = 0.15  # publishing weights took this much of the trainer's time
EVAL_SAVE_SHARE = 0.15  # evaluation + checkpoints took this much of the trainer's time
TOOL_SHARE = 0.5  # episodes spent this share of their time in tools...
NOWORK_IDLE = 0.3  # ...while the generator idled this much with the gate open
REWARD_QUEUE = 1.0  # reward calls waited for a worker this many times as long as they ran...
REWARD_SHARE = 0.1  # ...rewards took this share of the step (call-seconds over wall), and the trainer waited
LONG_TAIL = 4.0  # the longest response was this many times the mean while the trainer waited
NO_SIGNAL = 0.8  # share of groups whose rewards were all equal
ENTROPY_FLOOR = 0.02  # mean token entropy (nats) below which sampling has collapsed
CLIP_FRAC = 0.2  # share of tokens whose ratio was clipped
CAP_FRAC = 0.05  # share of tokens whose behaviour weight hit its cap (or was masked)
TRUNCATED = 0.2  # share of samples cut at gconfig.max_new_tokens
MISMATCH = 0.02  # mean |behaviour - recomputed log-prob| on tokens of the current version (float32: ~1e-6)
STALE_NEAR = 0.8  # mean staleness over the bound
HELD_OUT_LAST = 3  # held-out falling: the mean of the last this many evaluations...
HELD_OUT_SIGMAS = 4.0  # ...this many standard errors of one evaluation below the best one...
HELD_OUT_DROP = 0.05  # ...and at least this far (the best of many noisy evaluations is itself ~2.4 errors high)
SFT_LOSS = 0.01  # an SFT loss this low...
SFT_ACCURACY = 0.2  # ...with held-out accuracy below this: memorised
THREADS_GAIN = 0.4  # the share of the trainer's compute that more threads/ranks save (bench/bottlenecks.py: twice
# the cores cut a step from 12.2 s to 7.6 s)


@dataclass(frozen=True)
class Finding:
    name: str
    kind: str  # "bottleneck" or "health"
    evidence: str  # the numbers the rule read
    change: str  # the one change with the largest expected gain
    gain: float = 0.0  # bottlenecks: the share of step time the change is expected to save (an estimate)

    def line(self) -> str:
        return f"{self.name}: {self.evidence} -> {self.change}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    findings: list[Finding]
    account: Account
    settings: dict  # what the rules knew of the configuration (max_staleness, n_samples, ...)

    @property
    def bottleneck(self) -> Finding | None:
        found = [f for f in self.findings if f.kind == "bottleneck"]
        return max(found, key=lambda f: f.gain) if found else None

    def lines(self) -> list[str]:
        """A few lines for the console: the account, the bottleneck, then the other findings."""
        acc = self.account
        out = []
        if acc.steps:
            out.append("time: trainer " + _shares(acc.fractions("trainer")) + " | generator "
                       + _shares(acc.fractions("gen")))
        top = self.bottleneck
        if top:
            out.append(f"bottleneck: {top.line()}")
        elif not acc.steps:
            out.append("bottleneck: not judged yet (the rules read the training steps after the first, which waits "
                       "for the first batch whatever the settings)")
        else:
            out.append("bottleneck: none found (neither side waits for the other much)")
        out += [f"{'also' if f.kind == 'bottleneck' else 'health'}: {f.line()}" for f in self.findings if f is not top]
        return out

    def to_dict(self) -> dict:
        top = self.bottleneck
        return {"bottleneck": top.name if top else None, "findings": [f.to_dict() for f in self.findings],
                "account": self.account.to_dict(), "settings": self.settings}


def diagnose(records: list[dict], settings: dict | None = None) -> Verdict:
    """The verdict on a run's ``metrics.jsonl`` records (``settings``: ``max_staleness``, ``n_samples``,
    ``max_new_tokens``, ``workers`` as far as known)."""
    settings = dict(settings or {})
    steps = [r for r in records if r.get("step", 0) > 0]
    steps = steps[1:][-WINDOW:]  # the first step waits for the first batch whatever the settings: never read
    acc = account(steps)
    findings = _bottlenecks(acc, steps, settings) + _health(steps, records, settings)
    return Verdict(findings, acc, settings)


def diagnose_sft(records: list[dict]) -> Verdict:
    """The verdict on an SFT run's ``sft_metrics.jsonl``: memorising a small dataset."""
    findings = []
    evals = [r for r in records if _finite(r.get("eval_accuracy")) is not None]
    tail = [r["loss"] for r in records[-WINDOW:] if _finite(r.get("loss")) is not None]
    if evals and tail:
        loss, best = sum(tail) / len(tail), max(evals, key=lambda r: r["eval_accuracy"])
        last = evals[-1]["eval_accuracy"]
        if loss < SFT_LOSS and last < SFT_ACCURACY:
            findings.append(Finding(
                "memorising", "health",
                f"training loss {loss:.4f} over the last {len(tail)} steps, held-out accuracy {last:.3f} (best "
                f"{best['eval_accuracy']:.3f} at step {best['step']})",
                f"the model learnt its {records[-1].get('examples', 'few')} examples by heart: give it more data, "
                f"fewer steps, or start RL from the best held-out model (step {best['step']}: OUTPUT/best)"))
    return Verdict(findings, Account(), {})


# ---- bottlenecks ---------------------------------------------------------------------------------------
def _bottlenecks(acc: Account, steps: list[dict], s: dict) -> list[Finding]:
    if not acc.steps or not acc.measured("trainer"):
        return []
    t, g = acc.fractions("trainer"), acc.fractions("gen")
    max_staleness = s.get("max_staleness")
    out = []
    busy = 1.0 - t["wait"]
    if g["idle_gate"] >= GATE_IDLE and t["wait"] < TRAINER_WAIT:
        compute = t["recompute"] + t["fwd_bwd"] + t["optim"]  # what more threads or ranks make faster
        out.append(Finding(
            "trainer-bound", "bottleneck",
            f"the generator idled {g['idle_gate']:.0%} of the time with the staleness gate closed while the trainer "
            f"was busy {busy:.0%} (waiting {t['wait']:.0%}; computing {compute:.0%})",
            _lend_cores(s, g["idle_gate"]) + "make training faster: "
            + _more_threads(s, "more trainer threads (actor.threads) or ranks (actor.backend=ddp:dN)",
                            "more cores (the trainer already borrows the generator's core while it idles: "
                            "cluster.cpu_split=auto) or ranks (actor.backend=ddp:dN)",
                            "more trainer ranks (actor.backend=ddp:dN)")
            + f", or fewer samples per prompt (gconfig.n_samples{_now(s, 'n_samples')})"
            + (f"; η >= 1 (rollout.max_head_offpolicyness) would also hide the {t['wait']:.0%} the trainer waits"
               if max_staleness == 0 and t["wait"] > 0.02 else "; a larger η would not help"),
            compute * THREADS_GAIN))
    if t["wait"] >= TRAINER_WAIT:
        lens = [(r.get("response_len_max"), r.get("response_len_mean")) for r in steps]
        tail = [mx / mean for mx, mean in lens if _finite(mx) and _finite(mean) and mean > 0]
        tail_ratio = sorted(tail)[len(tail) // 2] if tail else 0.0
        if tail_ratio >= LONG_TAIL:
            out.append(Finding(
                "long-tail-bound", "bottleneck",
                f"the trainer waited {t['wait']:.0%} of the time; the longest response of a batch was "
                f"{tail_ratio:.1f}x the mean (median over steps)",
                f"let the rest of the batch go on without the long samples: raise η "
                f"(rollout.max_head_offpolicyness{_now(s, 'max_staleness')}) or cap gconfig.max_new_tokens"
                f"{_now(s, 'max_new_tokens')}", t["wait"] * 0.8))
        elif _rewards_queue(acc):
            r = acc.seconds["reward"]
            out.append(Finding(
                "reward-bound", "bottleneck",
                f"the trainer waited {t['wait']:.0%} of the time; reward calls spent "
                f"{r['queue'] / max(1e-9, r['queue'] + r['run']):.0%} of their time waiting for a worker "
                f"({r['queue']:.0f} call-seconds queued, {r['run']:.0f} running, over {acc.wall_s:.0f} s of wall time)",
                f"more reward workers (reward.workers{_now(s, 'workers')})", t["wait"]))
        elif acc.measured("episode") and acc.fractions("episode")["tool"] >= TOOL_SHARE:
            out.append(Finding(
                "tool-bound", "bottleneck",
                f"the trainer waited {t['wait']:.0%}; episodes spent {acc.fractions('episode')['tool']:.0%} of "
                f"their time in tools and the generator idled {g['idle_nowork'] + g['idle_gate']:.0%} "
                f"({g['idle_nowork']:.0%} with nothing to do, {g['idle_gate']:.0%} behind the closed gate)",
                f"keep more episodes in flight: raise η (rollout.max_head_offpolicyness{_now(s, 'max_staleness')}) or "
                "rollout.max_concurrent_rollouts", t["wait"]))
        elif g["idle_gate"] > 0.05 or (max_staleness is not None and max_staleness == 0):
            out.append(Finding(
                "generator-bound", "bottleneck",
                f"the trainer waited {t['wait']:.0%} of the time while the staleness gate held work back "
                f"{g['idle_gate']:.0%} (η{_now(s, 'max_staleness', eq='=')})",
                f"raise η (rollout.max_head_offpolicyness{_now(s, 'max_staleness')}): generation may run further ahead",
                t["wait"]))
        else:
            out.append(Finding(
                "generator-bound", "bottleneck",
                f"the trainer waited {t['wait']:.0%} of the time; the generator was busy "
                f"{g['decode'] + g['prefill'] + g['reprefill']:.0%} and the gate seldom closed, so a larger η "
                "would not help",
                "make generation faster: "
                + _more_threads(s, "more engine threads (rollout.threads) or servers (rollout.backend=asyncrl:dN)",
                                "more engine threads (cluster.cpu_split=fixed with rollout.threads set to every "
                                "core: the shared split keeps the engine at half of them) or servers "
                                "(rollout.backend=asyncrl:dN)", "more servers (rollout.backend=sglang:dN, vllm:dN)")
                + ", or fewer tokens (gconfig.n_samples, gconfig.max_new_tokens)",
                t["wait"]))
    if t["sync"] >= SYNC_SHARE:
        out.append(Finding(
            "sync-bound", "bottleneck", f"publishing weights took {t['sync']:.0%} of the time",
            _faster_transport(s.get("transport")) + "a smaller model dtype (model.dtype=bfloat16)",
            t["sync"] * 0.9))  # disk -> inprocess
            # with the ~100M model saved 33% of a step whose sync was 34%
    if t["eval"] + t["save"] >= EVAL_SAVE_SHARE:
        out.append(Finding(
            "eval/checkpoint-bound", "bottleneck",
            f"evaluation took {t['eval']:.0%} and checkpoints {t['save']:.0%} of the trainer's time",
            "evaluate and save less often (evaluator.freq_steps, saver.freq_steps), on fewer items "
            "(valid_dataset.size)" + _beside(s),
            (t["eval"] + t["save"]) * 0.8))
    if acc.measured("episode") and not any(f.name == "tool-bound" for f in out):
        e = acc.fractions("episode")
        if e["tool"] >= TOOL_SHARE and g["idle_nowork"] >= NOWORK_IDLE:
            out.append(Finding(
                "tool-bound", "bottleneck",
                f"episodes spent {e['tool']:.0%} of their time in tools and the generator idled "
                f"{g['idle_nowork']:.0%} with nothing to do",
                f"keep more episodes in flight: raise η (rollout.max_head_offpolicyness{_now(s, 'max_staleness')}) or "
                "rollout.max_concurrent_rollouts", g["idle_nowork"] * 0.5))
    return out


def _rewards_queue(acc: Account) -> bool:
    """Reward calls waited for a worker at least as long as they ran, and took a tenth of the wall time."""
    if not acc.measured("reward") or not acc.wall_s:
        return False
    r = acc.seconds["reward"]
    return r["run"] > 0 and r["queue"] >= REWARD_QUEUE * r["run"] and (r["queue"] + r["run"]) / acc.wall_s >= REWARD_SHARE


# ---- learning health ------------------------------------------------------------------------------------
def _health(steps: list[dict], records: list[dict], s: dict) -> list[Finding]:
    if not steps:
        return []
    m = {k: _mean(steps, k) for k in ("groups_no_signal_frac", "entropy", "clip_frac", "behav_weight_capped_frac",
                                      "truncated_frac", "mismatch_abs_mean", "staleness_mean")}
    out = []
    if m["groups_no_signal_frac"] is not None and m["groups_no_signal_frac"] >= NO_SIGNAL:
        out.append(Finding("no learning signal", "health",
                           f"{m['groups_no_signal_frac']:.0%} of groups had equal rewards (zero advantages)",
                           "the task is too hard or too easy for the policy: more samples per prompt "
                           f"(gconfig.n_samples{_now(s, 'n_samples')}), easier/harder prompts, or check the reward"))
    if m["entropy"] is not None and m["entropy"] < ENTROPY_FLOOR:
        out.append(Finding("entropy collapse", "health", f"mean token entropy {m['entropy']:.4f} nats",
                           "sampling is nearly greedy, so groups stop differing: lower actor.lr, raise "
                           "gconfig.temperature, or add actor.kl_ctl"))
    if m["clip_frac"] is not None and m["clip_frac"] >= CLIP_FRAC:
        out.append(Finding("clipping", "health", f"{m['clip_frac']:.0%} of tokens clipped",
                           "updates are too large: lower actor.lr or raise actor.ppo_n_minibatches"))
    if m["behav_weight_capped_frac"] is not None and m["behav_weight_capped_frac"] >= CAP_FRAC:
        out.append(Finding("behaviour cap", "health",
                           f"{m['behav_weight_capped_frac']:.0%} of tokens hit the behaviour-weight cap",
                           f"samples are too far off-policy: lower η (rollout.max_head_offpolicyness{_now(s, 'max_staleness')})"
                           " or raise actor.behav_imp_weight_cap"))
    if m["truncated_frac"] is not None and m["truncated_frac"] >= TRUNCATED:
        out.append(Finding("truncation", "health", f"{m['truncated_frac']:.0%} of samples cut at max_new_tokens",
                           f"raise gconfig.max_new_tokens{_now(s, 'max_new_tokens')} (or reward brevity)"))
    if m["mismatch_abs_mean"] is not None and m["mismatch_abs_mean"] >= MISMATCH:
        out.append(Finding("train/inference mismatch", "health",
                           f"|behaviour - recomputed log-prob| {m['mismatch_abs_mean']:.4f} on tokens of the current "
                           "version (float32 engines: ~1e-6)",
                           "the engine samples from another distribution than the trainer scores: a low-precision "
                           "engine (model.dtype) or a sampling mismatch; keep actor.behav_imp_weight_cap on"))
    max_staleness = _mean(steps, "max_staleness") if not isinstance(s.get("max_staleness"), int) else s["max_staleness"]  # auto: each step's
    if max_staleness and m["staleness_mean"] is not None and m["staleness_mean"] >= STALE_NEAR * max_staleness:
        out.append(Finding("staleness at its bound", "health",
                           f"mean staleness {m['staleness_mean']:.2f} with η = {max_staleness:g}",
                           "generation runs as far ahead as allowed: fine if the trainer does not wait; a larger η "
                           "trades freshness for speed"))
    falling = _held_out_falling(records, s)
    return out + ([falling] if falling else [])


def _held_out_falling(records: list[dict], s: dict) -> Finding | None:
    """Held-out accuracy well below its best over the last evaluations: the updates undo what the run had learnt
    (too large a learning rate: at actor.lr=1e-4 the default run fell from 0.440 at step 40 to 0.165 at step 100).
    An evaluation of n items has a standard error of sqrt(p(1-p)/n); runs from before ``eval_items`` was logged
    are not read."""
    evals = [r for r in records if _finite(r.get("eval_accuracy")) is not None and r.get("eval_items")]
    if len(evals) < HELD_OUT_LAST + 1:
        return None
    best = max(evals[:-HELD_OUT_LAST], key=lambda r: r["eval_accuracy"])
    last = sum(r["eval_accuracy"] for r in evals[-HELD_OUT_LAST:]) / HELD_OUT_LAST
    p, n = best["eval_accuracy"], best["eval_items"]
    error = math.sqrt(p * (1 - p) / n)
    if best["eval_accuracy"] - last < max(HELD_OUT_DROP, HELD_OUT_SIGMAS * error):
        return None
    return Finding("held-out falling", "health",
                   f"held-out accuracy {last:.3f} over the last {HELD_OUT_LAST} evaluations, best {p:.3f} at step "
                   f"{best['step']} (one evaluation of {n} items: ±{error:.3f})",
                   f"the updates undo what the run learnt: lower actor.lr{_now(s, 'lr')}; "
                   + ("the starting model was better" if best["step"] == 0 else
                      f"the checkpoint of step {best['step']} is the one to keep, where it was saved "
                      "(saver.freq_steps)"))


# ---- helpers --------------------------------------------------------------------------------------------
def _mean(records: list[dict], key: str) -> float | None:
    values = [v for r in records if (v := _finite(r.get(key))) is not None]
    return sum(values) / len(values) if values else None


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


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
    return ("use a faster weight transport (rollout.weight_transport=dist for servers; inprocess for the local "
            "engine) or ")


def _beside(settings: dict) -> str:
    """The evaluation and checkpoints the run does not yet do beside training."""
    keys = [k for k, on in (("evaluator.background", settings.get("eval_background")),
                            ("saver.background", settings.get("save_background"))) if not on]
    return f", or beside training ({', '.join(k + '=true' for k in keys)})" if keys else ""


def _now(settings: dict, name: str, eq: str = ", now ") -> str:
    value = settings.get(name)
    return "" if value is None else f"{eq}{value}"


def _shares(fractions: dict[str, float]) -> str:
    shown = sorted(((p, f) for p, f in fractions.items() if f >= 0.01), key=lambda pf: -pf[1])
    return ", ".join(f"{p} {f:.0%}" for p, f in shown) or "-"
