"""The hardware profile measured on this machine (asyncrl/plan/calibrate.py ``measure``): with the shared split it
also measures how much faster training runs with the engine's borrowed core; without it, that stays 1. Either
way it times decode and training side by side (the slowdowns are timings: only their presence is checked)."""

import random

import pytest

from asyncrl.plan.calibrate import measure
from asyncrl.trainer import PolicyTrainer

from conftest import make_model


@pytest.mark.parametrize("trainer_most", [0, 2])
def test_the_profile_measures_the_borrowed_core_only_for_the_shared_split(trainer_most):
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randrange(4, 12))] for _ in range(16)]
    fitted = measure(
        make_model(),
        None,
        prompts,
        max_slots=8,
        max_len=64,
        max_new_tokens=16,
        n_samples=2,
        temperature=1.0,
        stop_token_ids=(),
        engine_threads=1,
        trainer_threads=1,
        make_trainer=lambda m: PolicyTrainer(m),
        trainer_most=trainer_most,
    )
    costs = fitted.profile.costs
    assert costs.train_per_token_s > 0 and costs.decode_per_seq_s + costs.decode_base_s > 0
    assert costs.decode_overlap_x > 0 and costs.train_overlap_x > 0
    assert any(n.startswith("side by side (each in its own thread)") for n in fitted.profile.notes)
    if trainer_most:
        assert costs.train_borrow_x > 0
        assert any("the shared split: training on 2 threads" in n for n in fitted.profile.notes)
    else:
        assert costs.train_borrow_x == 1.0


def _record(step: int, epochs: int, **more) -> dict:
    """A step of 1000 trained tokens costing 2 ms a token and pass, a 0.5 s proximal recompute, 0.2 s optimizer."""
    return {
        "step": step,
        "step_time_s": 10.0,
        "n_samples": 8,
        "response_len_mean": 50.0,
        "train_tokens": 1000,
        "gen_tokens_per_s": 40.0,
        "gen_decode_s": 4.0,
        "gen_prefill_s": 0.5,
        "trainer_fwd_bwd_s": 2.0 * epochs,
        "trainer_recompute_s": 0.5,
        "trainer_optim_s": 0.2,
        "trainer_other_s": 0.0,
        "trainer_sync_s": 0.1,
        "reward_calls": 8 * step,
        "reward_run_s": 0.8,
        **more,
    }


@pytest.mark.parametrize("epochs", [1, 4])
def test_a_run_is_fitted_per_pass_after_its_first_step(epochs):
    """Passes over a batch and the proximal recompute are priced apart (the plan adds them back per its own
    settings: they were counted twice, 5x at ppo_epochs=4); the first step's warm-up is not read; reward calls
    are counted over the steps read."""
    from asyncrl.plan.calibrate import fit_run

    warm_up = _record(1, epochs, trainer_optim_s=1.6, reward_run_s=3.0)
    costs = fit_run(
        [{"step": 0}, warm_up] + [_record(s, epochs) for s in range(2, 6)], 64, 8, epochs=epochs
    ).profile.costs
    assert costs.train_per_token_s == pytest.approx(0.002) and costs.recompute_per_token_s == pytest.approx(0.0005)
    assert costs.train_base_s == pytest.approx(0.2) and costs.reward_s == pytest.approx(0.1)
    assert costs.train_s(1000, recompute=True, epochs=epochs) == pytest.approx(0.2 + 2.0 * epochs + 0.5)
    two_passes = fit_run(
        [{"step": 0}, warm_up] + [_record(s, epochs) for s in range(2, 6)], 64, 8, epochs=epochs, passes=2
    ).profile.costs  # the proximal and the reference model's, timed together
    assert two_passes.recompute_per_token_s == pytest.approx(0.00025)
    assert two_passes.train_s(1000, recompute=2, epochs=epochs) == pytest.approx(0.2 + 2.0 * epochs + 0.5)


def test_an_agent_runs_every_call_prefills_its_own_context():
    """Single-turn: a prompt's n samples share one prefill; an agent episode's calls (each a trained sample) each
    prefill their own context, so the fitted cost per token is not n times too high."""
    from asyncrl.plan.calibrate import fit_run

    single = [{"step": 0}] + [_record(s, 1) for s in range(1, 6)]
    agent = [{"step": 0}] + [_record(s, 1, agent_calls=8 * s, agent_episodes=4 * s) for s in range(1, 6)]
    per_token = {
        name: fit_run(records, 64, 8).profile.costs.prefill_per_token_s
        for name, records in (("single", single), ("agent", agent))
    }
    assert per_token["single"] == pytest.approx(8 * per_token["agent"])


def test_a_resumed_runs_counters_restart_and_are_counted_across():
    """reward_calls restarts at 0 in a resumed process: 8 calls a step are counted over the resume (the last value
    minus the first counted 4x fewer calls, a reward cost 4x too high)."""
    from asyncrl.plan.calibrate import fit_run

    steps = [_record(s, 1) for s in range(1, 5)] + [_record(s, 1, reward_calls=8 * (s - 4)) for s in range(5, 9)]
    costs = fit_run([{"step": 0}] + steps, 64, 8).profile.costs
    assert costs.reward_s == pytest.approx(0.1)


def test_a_run_that_shared_prefixes_is_priced_per_position_computed():
    """400 of the 1000 tokens a step were shared prefixes: 2 s of forward-backward for 600 positions. The step is
    one group of 8 with a 75-token prompt and 400 response tokens: computing the prompt once leaves 475 positions;
    600 > 475 gives a factor of 1 (no more sharing than the prompts explain), 300 gives 300 / 475."""
    from asyncrl.plan.calibrate import fit_run, positions_computed

    records = [{"step": 0}] + [_record(s, 1, prefix_shared_frac=0.4) for s in range(1, 6)]
    assert positions_computed(records[1]) == pytest.approx(600)
    fitted = fit_run(records, 64, 8)
    assert fitted.profile.costs.train_per_token_s == pytest.approx(2.0 / 600)
    assert fitted.positions_x == 1.0
    # the completions shared their first tokens too: 300 positions computed of the 475 the prompts explain
    shared_more = fit_run([{"step": 0}] + [_record(s, 1, prefix_shared_frac=0.7) for s in range(1, 6)], 64, 8)
    assert shared_more.positions_x == pytest.approx(300 / 475)
    assert fit_run([{"step": 0}] + [_record(s, 1) for s in range(1, 6)], 64, 8).positions_x == 1.0  # none shared
