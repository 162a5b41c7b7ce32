"""The verdict's learning-health rules: no learning signal, reward failures, entropy collapse, clipping, the
behaviour-weight cap, truncation, train/inference mismatch, staleness at its bound, held-out accuracy falling from
its best (docs/report.md lists them and how to act on each)."""

from __future__ import annotations

import math

from asyncrl.telemetry.findings import Finding, finite, mean, now

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
ESS_FLOOR = 0.5  # normalised ESS of the behaviour weights below which a few tokens carry the step
GROWTH = 1.5  # a quantity is growing when the mean of the window's last third is this many times its first third's
REWARD_FAILING = 0.05  # share of the run's reward calls that failed (errors and timeouts)
DRIFT_FLOOR = 0.01  # ...and the behaviour/trained KL of stale tokens reaches this (nats)


def health(steps: list[dict], records: list[dict], s: dict) -> list[Finding]:
    if not steps:
        return []
    m = {
        k: mean(steps, k)
        for k in (
            "groups_no_signal_frac",
            "entropy",
            "clip_frac",
            "behav_weight_capped_frac",
            "truncated_frac",
            "mismatch_abs_mean",
            "staleness_mean",
        )
    }
    out = []
    if m["groups_no_signal_frac"] is not None and m["groups_no_signal_frac"] >= NO_SIGNAL:
        out.append(
            Finding(
                "no learning signal",
                "health",
                f"{m['groups_no_signal_frac']:.0%} of groups had equal rewards (zero advantages)",
                "the task is too hard or too easy for the policy: more samples per prompt "
                f"(gconfig.n_samples{now(s, 'n_samples')}), easier/harder prompts, or check the reward",
            )
        )
    if m["entropy"] is not None and m["entropy"] < ENTROPY_FLOOR:
        out.append(
            Finding(
                "entropy collapse",
                "health",
                f"mean token entropy {m['entropy']:.4f} nats",
                "sampling is nearly greedy, so groups stop differing: lower actor.lr, raise "
                "gconfig.temperature, or add actor.kl_ctl",
            )
        )
    failing = _reward_failures(steps)
    if failing is not None:
        out.append(failing)
    if m["clip_frac"] is not None and m["clip_frac"] >= CLIP_FRAC:
        out.append(
            Finding(
                "clipping",
                "health",
                f"{m['clip_frac']:.0%} of tokens clipped",
                "updates are too large: lower actor.lr or raise actor.ppo_n_minibatches",
            )
        )
    if m["behav_weight_capped_frac"] is not None and m["behav_weight_capped_frac"] >= CAP_FRAC:
        out.append(
            Finding(
                "behaviour cap",
                "health",
                f"{m['behav_weight_capped_frac']:.0%} of tokens hit the behaviour-weight cap",
                f"samples are too far off-policy: lower η (rollout.max_head_offpolicyness{now(s, 'max_staleness')})"
                " or raise actor.behav_imp_weight_cap",
            )
        )
    if m["truncated_frac"] is not None and m["truncated_frac"] >= TRUNCATED:
        out.append(
            Finding(
                "truncation",
                "health",
                f"{m['truncated_frac']:.0%} of samples cut at max_new_tokens",
                f"raise gconfig.max_new_tokens{now(s, 'max_new_tokens')} (or reward brevity)",
            )
        )
    if m["mismatch_abs_mean"] is not None and m["mismatch_abs_mean"] >= MISMATCH:
        out.append(
            Finding(
                "train/inference mismatch",
                "health",
                f"|behaviour - recomputed log-prob| {m['mismatch_abs_mean']:.4f} on tokens of the current "
                "version (float32 engines: ~1e-6)",
                "the engine samples from another distribution than the trainer scores: a low-precision "
                "engine (model.dtype) or a sampling mismatch; keep actor.behav_imp_weight_cap on",
            )
        )
    max_staleness = (
        mean(steps, "max_staleness") if not isinstance(s.get("max_staleness"), int) else s["max_staleness"]
    )  # auto: each step's
    if max_staleness and m["staleness_mean"] is not None and m["staleness_mean"] >= STALE_NEAR * max_staleness:
        out.append(
            Finding(
                "staleness at its bound",
                "health",
                f"mean staleness {m['staleness_mean']:.2f} with η = {max_staleness:g}",
                "generation runs as far ahead as allowed: fine if the trainer does not wait; a larger η "
                "trades freshness for speed",
            )
        )
    falling = _held_out_falling(records, s)
    return out + _audit(steps, s) + ([falling] if falling else [])


def _audit(steps: list[dict], s: dict) -> list[Finding]:
    """The correction audit's findings: a proximal clip that cannot bind, behaviour weights that a few tokens
    dominate, drift from the behaviour policy and update sizes growing step over step."""
    out = []
    tokens = sum(r.get("train_tokens", 0) or 0 for r in steps)
    clipped = [finite(r.get("clip_frac")) for r in steps]
    decoupled = s.get("policy_loss", "decoupled_ppo") in ("decoupled_ppo", "cispo")
    inert = decoupled and s.get("one_step") and not s.get("trusted") and s.get("max_staleness")
    if inert and clipped and all(c == 0.0 for c in clipped):
        out.append(
            Finding(
                "proximal clip inert",
                "health",
                f"actor.eps_clip never bound: 0 of {tokens:,} tokens over the last {len(steps)} steps; at "
                "ppo_n_minibatches=1 the proximal clip cannot bind (the proximal policy is the one trained)",
                "stale tokens are bounded by the behaviour-weight cap alone: add a trust region across versions "
                "(actor.behav_eps_clip=auto, the default since 2026-12), or train several steps a batch "
                "(actor.ppo_n_minibatches=4)",
            )
        )
    ess = mean(steps, "ess")
    if ess is not None and ess < ESS_FLOOR:
        out.append(
            Finding(
                "behaviour weights concentrated",
                "health",
                f"effective sample size of the behaviour weights {ess:.2f} of the tokens (Kish, normalised)",
                f"a few stale tokens carry each step: lower η (rollout.max_head_offpolicyness"
                f"{now(s, 'max_staleness')}), scale steps by it (actor.ess_lr_scale=true) or bound the drift "
                "(actor.behav_eps_clip)",
            )
        )
    drift = _growing(steps, "behav_kl_stale")
    if drift is not None and drift[1] >= DRIFT_FLOOR:
        out.append(
            Finding(
                "drift growing",
                "health",
                f"KL(behaviour ‖ trained) on stale tokens {drift[0]:.4f} -> {drift[1]:.4f} nats over the last "
                f"{len(steps)} steps (on fresh tokens, the engine mismatch alone: "
                f"{mean(steps, 'behav_kl_fresh') or 0.0:.2g})",
                "the policy moves away from the samples it trains on faster than it regenerates them: lower η or "
                "actor.lr, or bound the drift (actor.behav_eps_clip)",
            )
        )
    growth = _growing(steps, "update_norm")
    if growth is not None:
        out.append(
            Finding(
                "updates growing",
                "health",
                f"the size of an update grew from {growth[0]:.3g} to {growth[1]:.3g} over the last {len(steps)} steps",
                f"the run is leaving its stable region: lower actor.lr{now(s, 'lr')} (or raise "
                "actor.ppo_n_minibatches, smaller steps each)",
            )
        )
    return out


def _reward_failures(steps: list[dict]) -> Finding | None:
    """The share of the run's reward calls that failed (the counters are the run's totals, so the last step's
    say it), when it is REWARD_FAILING or more: those samples trained on reward.default."""
    last = steps[-1]
    calls = finite(last.get("reward_calls_done", last.get("reward_calls")))
    errors, timeouts = (finite(last.get(k)) or 0.0 for k in ("reward_errors", "reward_timeouts"))
    if not calls or (errors + timeouts) / calls < REWARD_FAILING:
        return None
    kinds = sorted((k.split("/", 1)[1], int(v)) for k, v in last.items() if k.startswith("reward_errors/") and v)
    return Finding(
        "reward failures",
        "health",
        f"{(errors + timeouts) / calls:.0%} of {int(calls):,} reward calls failed (reward_errors {int(errors)}, "
        f"reward_timeouts {int(timeouts)}{''.join(f', {k} {n}' for k, n in kinds)}): those samples were scored "
        "reward.default, not by the task",
        "fix the reward (its first failure is logged with the sample id), or raise reward.timeout_s where calls "
        "time out",
    )


def _growing(steps: list[dict], key: str) -> tuple[float, float] | None:
    """(the mean of the first third, of the last third) of ``key`` over ``steps`` when the last is ``GROWTH``
    times the first or more; None otherwise, or with fewer than 6 steps."""
    values = [v for r in steps if (v := finite(r.get(key))) is not None]
    if len(values) < 6:
        return None
    third = len(values) // 3
    first, last = sum(values[:third]) / third, sum(values[-third:]) / third
    return (first, last) if first > 0 and last >= GROWTH * first else None


def _held_out_falling(records: list[dict], s: dict) -> Finding | None:
    """Held-out accuracy well below its best over the last evaluations: the updates undo what the run had learnt
    (too large a learning rate: at actor.lr=1e-4 the default run fell from 0.440 at step 40 to 0.165 at step 100).
    An evaluation of n items has a standard error of sqrt(p(1-p)/n); runs from before ``eval_items`` was logged
    are not read."""
    evals = [r for r in records if finite(r.get("eval_accuracy")) is not None and r.get("eval_items")]
    if len(evals) < HELD_OUT_LAST + 1:
        return None
    best = max(evals[:-HELD_OUT_LAST], key=lambda r: r["eval_accuracy"])
    last = sum(r["eval_accuracy"] for r in evals[-HELD_OUT_LAST:]) / HELD_OUT_LAST
    p, n = best["eval_accuracy"], best["eval_items"]
    error = math.sqrt(p * (1 - p) / n)
    if best["eval_accuracy"] - last < max(HELD_OUT_DROP, HELD_OUT_SIGMAS * error):
        return None
    rewards = [v for r in records if r.get("step", 0) > 0 and (v := finite(r.get("reward_mean"))) is not None]
    early, late = rewards[: len(rewards) // 3], rewards[-(len(rewards) // 3) :]
    rising = (
        f"; meanwhile the training reward rose {sum(early) / len(early):.3f} -> {sum(late) / len(late):.3f}"
        if early and sum(late) / len(late) > sum(early) / len(early) + 0.02
        else ""
    )
    return Finding(
        "held-out falling",
        "health",
        f"held-out accuracy {last:.3f} over the last {HELD_OUT_LAST} evaluations, best {p:.3f} at step "
        f"{best['step']} (one evaluation of {n} items: ±{error:.3f}){rising}",
        f"the updates undo what the run learnt: lower actor.lr{now(s, 'lr')}; "
        + (
            "the starting model was better"
            if best["step"] == 0
            else f"the checkpoint of step {best['step']} is the one to keep, where it was saved (saver.freq_steps)"
        ),
    )
