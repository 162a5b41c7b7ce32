"""The verdict's correction-audit rules (asyncrl.telemetry.health): an inert proximal clip is named with the tokens
it never bound, concentrated behaviour weights, drift from the behaviour policy and updates growing step over step;
each with the change to make, and none on a healthy run."""

from asyncrl.telemetry.verdict import diagnose


def _steps(n: int = 12, **fields) -> list[dict]:
    base = {"step_time_s": 1.0, "trainer_fwd_bwd_s": 1.0, "clip_frac": 0.0, "train_tokens": 1000, "ess": 0.95}
    rows = [{"step": i, **base} for i in range(1, n + 1)]
    for key, value in fields.items():
        for i, r in enumerate(rows):
            r[key] = value(i) if callable(value) else value
    return [{"step": 0, "eval_accuracy": 0.2}] + rows


def _found(records, **settings):
    return {f.name: f for f in diagnose(records, {"max_staleness": 2, **settings}).findings}


def test_an_inert_proximal_clip_is_named_with_the_tokens_it_never_bound():
    found = _found(_steps(), policy_loss="decoupled_ppo", one_step=True)
    clip = found["proximal clip inert"]
    assert "0 of 11,000 tokens" in clip.evidence and "actor.behav_eps_clip" in clip.change
    assert "proximal clip inert" not in _found(_steps(), policy_loss="decoupled_ppo", one_step=False)
    assert "proximal clip inert" not in _found(_steps(clip_frac=0.01), policy_loss="decoupled_ppo", one_step=True)
    assert "proximal clip inert" not in _found(_steps(), policy_loss="ppo", one_step=True)
    assert "proximal clip inert" not in _found(_steps(), policy_loss="decoupled_ppo", one_step=True, max_staleness=0)
    assert "proximal clip inert" not in _found(_steps(), policy_loss="decoupled_ppo", one_step=True, trusted=True)


def test_concentrated_weights_growing_drift_and_growing_updates_are_named():
    found = _found(
        _steps(ess=0.3, behav_kl_stale=lambda i: 0.01 * (i + 1), behav_kl_fresh=1e-6, update_norm=lambda i: 1 + i)
    )
    assert "0.30" in found["behaviour weights concentrated"].evidence
    assert "actor.ess_lr_scale" in found["behaviour weights concentrated"].change
    assert "stale tokens" in found["drift growing"].evidence and "fresh tokens" in found["drift growing"].evidence
    assert "actor.lr" in found["updates growing"].change
    healthy = _found(_steps(behav_kl_stale=0.02, update_norm=1.0))
    assert not {"behaviour weights concentrated", "drift growing", "updates growing"} & set(healthy)


def test_held_out_falling_while_the_reward_rises_says_both():
    rows = _steps(30, reward_mean=lambda i: 0.2 + 0.01 * i)
    evals = [
        {"step": s, "eval_accuracy": a, "eval_items": 200}
        for s, a in ((0, 0.3), (10, 0.5), (20, 0.3), (25, 0.3), (30, 0.3))
    ]
    found = _found(rows + evals)
    assert "the training reward rose 0.245 -> 0.445" in found["held-out falling"].evidence


def test_reward_failures_reach_the_verdict():
    """A run with 19% of its reward calls failing got only "trainer-bound" (issue 44): the share is named, with its
    kinds, and nothing below 5%."""
    calls = lambda i: 100 * (i + 1)  # noqa: E731 - the counters are the run's totals
    records = _steps(reward_calls_done=calls, reward_errors=lambda i: 19 * (i + 1), **{"reward_errors/JudgeError": 7})
    failing = _found(records)["reward failures"]
    assert "19% of 1,200 reward calls failed (reward_errors 228, reward_timeouts 0, JudgeError 7)" in failing.evidence
    assert "reward.timeout_s" in failing.change
    assert "reward failures" not in _found(_steps(reward_calls_done=calls, reward_errors=lambda i: 4 * (i + 1)))
    assert "reward failures" not in _found(_steps())
