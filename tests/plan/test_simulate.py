"""The planner's simulation (asyncrl/plan/simulate.py) on cases with a known answer: η = 0 with constant costs
is the sum of the phases; a generator that is never the bottleneck leaves the trainer no wait; the real gate
bounds the simulated staleness; an auto η settles; agent episodes wait on their tools, also after their last
call."""

import dataclasses

import pytest

from asyncrl.plan.costs import GPUS, MODELS, Costs, spec_costs
from asyncrl.plan.lengths import fixed, long_tail
from asyncrl.plan.simulate import ToolLatency, Workload, simulate

PHASES = Costs(decode_base_s=0.01, train_base_s=1.0, sync_s=0.1)  # 50 tokens: 0.5 s of generation a step


def _workload(**kw) -> Workload:
    """Every trained token priced (shared_prefix off) unless a case says otherwise."""
    base = {"batch_size": 4, "n_samples": 4, "lengths": fixed(50), "max_slots": 64, "steps": 12, "shared_prefix": False}
    return Workload(**{**base, **kw})


def test_synchronous_with_constant_costs_is_the_sum_of_the_phases():
    p = simulate(_workload(max_staleness=0), PHASES)
    assert p.step_time_s == pytest.approx(0.5 + 1.0 + 0.1)
    assert p.trainer_wait_frac == pytest.approx(0.5 / 1.6, rel=0.05) and p.staleness_mean == 0
    assert p.staleness_hist == {0: 12 * 16 * 50}


def test_a_generator_that_is_never_the_bottleneck_leaves_no_wait():
    """Asynchronous, generation (0.5 s a batch) hides behind training (1.1 s): the trainer waits only for the
    first batch."""
    p = simulate(_workload(max_staleness=2, steps=20), PHASES)
    assert p.step_time_s == pytest.approx(1.1)
    wait_after_first = p.trainer_wait_frac * p.total_s - 0.5
    assert wait_after_first == pytest.approx(0.0, abs=1e-6)


def test_a_slow_generator_makes_the_trainer_wait_whatever_eta():
    slow = Costs(decode_base_s=0.05, train_base_s=0.5, sync_s=0.0)  # 2.5 s a batch (16 slots), 0.5 s training
    for eta in (1, 4):
        p = simulate(_workload(max_staleness=eta, steps=20, max_slots=16), slow)
        assert p.step_time_s == pytest.approx(2.5, rel=0.02) and p.trainer_wait_frac > 0.7


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
def test_the_real_gate_bounds_the_simulated_staleness(eta):
    p = simulate(_workload(max_staleness=eta, lengths=long_tail(20, 200, 400), steps=30, seed=eta), PHASES)
    assert max(p.staleness_hist) <= eta


def test_auto_eta_settles_at_the_smallest_that_keeps_the_trainer_fed():
    p = simulate(_workload(max_staleness="auto", steps=80), PHASES)
    assert (
        p.max_staleness[0] == 8 and p.max_staleness[-1] == 1 and max(p.max_staleness) <= 8
    )  # from the limit down, by one at a time


def test_agent_episodes_wait_on_their_tools():
    """Three calls with a 1 s tool between them: synchronously each step takes at least two tool waits."""
    agent = _workload(max_staleness=0, calls_per_episode=3, tool=ToolLatency(1.0, 1.0), steps=6)
    sync = simulate(agent, PHASES)
    assert sync.step_time_s >= 2 * 1.0 + 3 * 0.5 + 1.1 - 1e-6
    async_ = simulate(_workload(max_staleness=4, calls_per_episode=3, tool=ToolLatency(1.0, 1.0), steps=12), PHASES)
    assert async_.step_time_s < sync.step_time_s * 0.6


def test_a_tool_after_the_last_call_holds_a_synchronous_step():
    """One call per episode, then a checker of 1 s (as bench/agent_env.py's): synchronously the step waits for it
    once; without ``tool_after_last`` the same episodes are single calls with no tool time at all."""
    checker = dict(max_staleness=0, calls_per_episode=1, tool=ToolLatency(1.0, 1.0), steps=6)
    checked = simulate(_workload(**checker, tool_after_last=True), PHASES)
    plain = simulate(_workload(**checker), PHASES)
    assert plain.step_time_s == pytest.approx(0.5 + 1.0 + 0.1)
    assert checked.step_time_s == pytest.approx(plain.step_time_s + 1.0, rel=0.05)


def test_fresh_calls_start_again_from_the_prompt_instead_of_continuing():
    """Three calls an episode: asked afresh each time (a retry), every call trains prompt + response; continuing
    the conversation, the second and third calls also carry the earlier calls and tool results."""
    agent = dict(max_staleness=0, calls_per_episode=3, tool=ToolLatency(0.1, 0.1), steps=6)
    fresh = simulate(_workload(**agent, fresh_calls=True), PHASES)
    chained = simulate(_workload(**agent), PHASES)
    per_step = 4 * 4 * 3 * (24 + 50)  # groups x episodes x calls x (prompt + response)
    assert fresh.trained_tokens_per_s * fresh.total_s == pytest.approx(6 * per_step)
    extra = 4 * 4 * ((50 + 16) + 2 * (50 + 16))  # the 2nd call carries one call and result, the 3rd two
    assert chained.trained_tokens_per_s * chained.total_s == pytest.approx(6 * (per_step + extra))


def test_fitted_tool_time_is_shared_by_the_tool_waits():
    from asyncrl.plan.calibrate import Fitted
    from asyncrl.plan.costs import Profile

    fitted = Fitted(Profile("p", PHASES, ""), fixed(50), 24, calls_per_episode=3, episode_tool_s=6.0)
    assert fitted.tool_s == pytest.approx(3.0)  # two waits between three calls
    assert dataclasses.replace(fitted, tool_after_last=True).tool_s == pytest.approx(2.0)


def test_spec_costs_scale_with_the_hardware():
    small, big = MODELS["r1-distill-qwen-1.5b"], MODELS["r1-distill-qwen-7b"]
    h800 = spec_costs(GPUS["h800"], small, engine_gpus=1, train_gpus=32).costs
    a100 = spec_costs(GPUS["a100"], small, engine_gpus=1, train_gpus=32).costs
    assert a100.train_per_token_s > 3 * h800.train_per_token_s  # 312 vs 989 TFLOP/s
    assert spec_costs(GPUS["h800"], big, engine_gpus=1, train_gpus=32).costs.decode_base_s > h800.decode_base_s
    assert all("TFLOP/s" in n or n for n in spec_costs(GPUS["h200"], small, engine_gpus=1, train_gpus=8).notes)


def test_the_shared_split_speeds_the_trainer_while_the_engine_idles():
    """cluster.cpu_split=auto as asyncrl.cluster.cores shares the cores (a step trains 16 samples of 24 + 50 tokens,
    1184 tokens: 1 s on the trainer's own threads). At η = 0 (alternating) the trainer always has the engine's
    core: generation 0.5 s as before, training 1 s / 4, sync unchanged. At η = 2 the trainer-bound run's
    generator is idle behind the gate for most of a step, and the trainer's micro-batches run with its core from
    then on: faster than fixed threads, slower than every micro-batch with it. With a speedup of 1 nothing
    changes."""
    costs = Costs(decode_base_s=0.01, train_per_token_s=1 / 1184, sync_s=0.1, train_borrow_x=4.0)
    assert simulate(_workload(max_staleness=0), costs).step_time_s == pytest.approx(0.5 + 1.0 + 0.1)
    assert simulate(_workload(max_staleness=0, cpu_split="alternating"), costs).step_time_s == pytest.approx(
        0.5 + 0.25 + 0.1
    )
    fixed_run = simulate(_workload(max_staleness=2, steps=20), costs)
    shared_run = simulate(_workload(max_staleness=2, steps=20, cpu_split="shared", shared_mb_tokens=64), costs)
    assert fixed_run.step_time_s == pytest.approx(1.1)
    assert 0.25 + 0.1 < shared_run.step_time_s < 1.1 - 0.3
    plain = dataclasses.replace(costs, train_borrow_x=1.0)
    assert simulate(_workload(max_staleness=2, steps=20, cpu_split="shared"), plain).step_time_s == pytest.approx(1.1)


def test_side_by_side_slowdowns_apply_only_while_the_other_side_works():
    """Decode steps twice as long while the trainer works: at η = 0 the phases never overlap, so nothing changes;
    at η = 2 the trainer-bound run keeps its step time and its generator is busy about twice as long (0.5 -> 1 s
    of each 1.1 s step, the first batch generated alone). Training 1.5x as long while an engine decodes: the
    η = 2 step grows, by less than 1.5x, as the engine idles behind the gate for the rest of the step."""
    slow_decode = dataclasses.replace(PHASES, decode_overlap_x=2.0)
    assert simulate(_workload(max_staleness=0), slow_decode).step_time_s == pytest.approx(1.6)
    base = simulate(_workload(max_staleness=2, steps=20), PHASES)
    both = simulate(_workload(max_staleness=2, steps=20), slow_decode)
    assert both.step_time_s == pytest.approx(1.1)
    assert both.gen_busy_frac == pytest.approx(2 * base.gen_busy_frac, rel=0.05)
    slow_train = dataclasses.replace(PHASES, train_overlap_x=1.5)
    assert simulate(_workload(max_staleness=0), slow_train).step_time_s == pytest.approx(1.6)
    grown = simulate(_workload(max_staleness=2, steps=20, shared_mb_tokens=64), slow_train).step_time_s
    assert 1.1 + 0.1 < grown < 1.5 * 1.0 + 0.1


def test_the_evaluation_after_a_step_is_booked_in_the_next_steps_record_as_the_loop_books_it():
    """Auto η reads the simulated records as it reads a run's: a step spent mostly evaluating is not read."""
    from asyncrl.plan.simulate import Simulation

    sim = Simulation(
        _workload(max_staleness="auto", eval_every=4, steps=12), dataclasses.replace(PHASES, eval_s=3.0, save_s=0.5)
    )
    sim.run()
    evals = [r["step"] for r in sim.steps if r["trainer_eval_s"]]
    assert evals == [5, 9] and all(r["trainer_save_s"] == 0 for r in sim.steps)
    assert all(r["step_time_s"] > 3.0 for r in sim.steps if r["step"] in evals)


def test_the_engines_pause_is_within_the_sync_not_after_it():
    """Costs: the engines are held for pause_s *of* sync_s. A synchronous run waits for the weights anyway, so
    the pause adds nothing to its step (GPU projections set pause_s = sync_s and paid the sync twice)."""
    p = simulate(_workload(max_staleness=0), dataclasses.replace(PHASES, sync_s=1.0, pause_s=1.0))
    assert p.step_time_s == pytest.approx(0.5 + 1.0 + 1.0)


def test_shared_prefixes_price_a_groups_prompt_once():
    """A trainer-bound step of 4 groups of 4 (prompt 100, responses 50) at 1 ms a position: 2,400 positions
    without sharing, 4 x (100 + 4 x 50) = 1,200 with each group's prompt computed once."""
    costs = Costs(decode_base_s=0.001, train_per_token_s=0.001)
    off = simulate(_workload(max_staleness=0, prompt_tokens=100, shared_prefix=False, steps=4), costs)
    on = simulate(_workload(max_staleness=0, prompt_tokens=100, shared_prefix=True, steps=4), costs)
    assert off.positions_per_step == 2400 and on.positions_per_step == 1200
    assert on.step_time_s == pytest.approx(off.step_time_s - 1.2)
    fitted = simulate(
        _workload(max_staleness=0, prompt_tokens=100, shared_prefix=True, steps=4, positions_x=0.5), costs
    )
    assert fitted.positions_per_step == 600  # completions that share their first tokens too (fitted from a run)


def test_an_agents_calls_share_their_history():
    """Three calls an episode continuing one conversation: the group's prompt once, then each call's output and,
    after the first, the tool's result before it; the trained tokens still count every call's whole context."""
    agent = dict(max_staleness=0, calls_per_episode=3, tool=ToolLatency(0.1, 0.1), steps=6, shared_prefix=True)
    chained = simulate(_workload(**agent), PHASES)
    assert chained.positions_per_step == 4 * (24 + 4 * (3 * 50 + 2 * 16))
    fresh = simulate(_workload(**agent, fresh_calls=True), PHASES)
    assert fresh.positions_per_step == 4 * (24 + 4 * 3 * 50)
