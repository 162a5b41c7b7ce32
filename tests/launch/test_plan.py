"""``asyncrl plan`` (asyncrl/launch/plan.py): the configured run predicted from a hardware profile, as one JSON
object with the documented keys, a sweep as a table with a recommendation (or a list in JSON), a page with the
curves; a missing or broken profile is one line and exit status 2."""

import json
from pathlib import Path

import pytest

from asyncrl import cli
from asyncrl.plan.costs import Costs, Profile, load_profile, save_profile

KEYS = {"step_time_s", "gen_busy_frac", "trainer_wait_frac", "staleness_mean", "tokens_per_s"}


@pytest.fixture
def profile(tmp_path):
    costs = Costs(
        decode_base_s=0.005,
        decode_per_seq_s=3e-4,
        prefill_per_token_s=4e-4,
        train_base_s=0.5,
        train_per_token_s=8e-4,
        sync_s=0.04,
        save_s=0.05,
        eval_s=2.0,
    )
    return str(save_profile(Profile("hand-made", costs, "by hand"), tmp_path / "profile.yaml"))


def test_one_prediction_as_json(profile, capsys):
    assert cli.main(["plan", "--hardware", profile, "--json", "total_train_steps=40"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert KEYS <= set(out) and out["step_time_s"] > 0 and 0 <= out["gen_busy_frac"] <= 1
    assert out["time_for_steps_s"] == pytest.approx(40 * out["step_time_s"], rel=0.3)


def test_a_sweep_is_a_table_with_a_recommendation_and_a_page(profile, tmp_path, capsys):
    page = tmp_path / "plan.html"
    assert (
        cli.main(
            ["plan", "--hardware", profile, "--sweep", "rollout.max_head_offpolicyness=0,1,4", "--html", str(page)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("rollout.max_head_offpolicyness=") == 3 and out.count("<- recommended") == 1
    assert page.read_text().count("<svg") == 5
    assert (
        cli.main(
            [
                "plan",
                "--hardware",
                profile,
                "--json",
                "--sweep",
                "rollout.max_head_offpolicyness=0,2",
                "--sweep",
                "gconfig.n_samples=4,8",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and all(KEYS <= set(r) for r in rows)
    sync = next(r for r in rows if r["rollout.max_head_offpolicyness"] == "0" and r["gconfig.n_samples"] == "8")
    assert sync["staleness_mean"] == 0
    # the recommendation, marked in JSON, is judged on trained tokens per second (n_samples changes a step's work)
    [best] = [r for r in rows if r["recommended"]]
    most = max(r["trained_tokens_per_s"] for r in rows)
    assert best["trained_tokens_per_s"] >= most / 1.05
    assert cli.main(["plan", "--hardware", profile, "--json", "--sweep", "total_train_steps=10,1000"]) == 0
    assert [r["steps"] for r in json.loads(capsys.readouterr().out)] == [10, 1000]
    assert cli.main(["plan", "--hardware", profile, "--sweep", "actor.threads=1,2"]) == 0  # costs: one profile's
    assert "the swept settings do not change what the plan simulates" in capsys.readouterr().err


def test_without_a_profile_it_says_how_to_get_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("asyncrl plan: error: no hardware profile") and "--profile" in err and "\n" not in err


def test_a_broken_profile_names_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("costs:\n  decode_base_s: -1\n")
    assert cli.main(["plan", "--hardware", str(bad)]) == 2
    assert "costs.decode_base_s must be a number >= 0" in capsys.readouterr().err
    bad.write_text("costs:\n  decode_speed: 3\n")
    with pytest.raises(ValueError, match="unknown cost keys"):
        load_profile(bad)


def test_agent_calls_asked_afresh_train_fewer_tokens_than_a_continued_conversation(profile, capsys):
    """--fresh-calls: every call of an episode starts from the prompt again (retries), so the trainer sees no
    earlier calls in later ones."""
    base = [
        "plan",
        "--hardware",
        profile,
        "--json",
        "--config",
        "examples/agent_lookup.yaml",
        "--calls-per-episode",
        "3",
        "rollout.max_head_offpolicyness=0",
        "total_train_steps=10",
    ]
    outs = []
    for extra in ([], ["--fresh-calls"]):
        assert cli.main(base + extra) == 0
        outs.append(json.loads(capsys.readouterr().out))
    chained, fresh = outs
    per_step = [o["trained_tokens_per_s"] * o["time_for_steps_s"] / o["steps"] for o in (fresh, chained)]
    assert per_step[0] < 0.8 * per_step[1] and fresh["step_time_s"] < chained["step_time_s"]


def _run_dir(tmp_path, torn: str = "", **record) -> Path:
    """A run directory of 5 steps of 64 samples of 60 tokens (3 s each: 2 s training), then ``torn``."""
    run = tmp_path / "run"
    run.mkdir()
    record = {
        "step_time_s": 3.0,
        "gen_decode_s": 1.0,
        "gen_prefill_s": 0.1,
        "gen_tokens_per_s": 600.0,
        "n_samples": 64,
        "response_len_mean": 60.0,
        "response_len_max": 60,
        "train_tokens": 5376,
        "trainer_fwd_bwd_s": 2.0,
        "trainer_recompute_s": 0.0,
        "trainer_optim_s": 0.05,
        "trainer_other_s": 0.0,
        "trainer_sync_s": 0.01,
        **record,
    }
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **record}) + "\n" for s in range(1, 6)) + torn)
    return run


def test_a_profile_with_a_runs_workload_takes_the_profiles_costs_and_the_runs_lengths(profile, tmp_path, capsys):
    """RL lengthens the answers a profile sampled from the starting policy: --hardware (or --profile) with
    --from-run prices the run's own lengths at the profile's costs; --from-run alone takes the run's costs too."""
    run = _run_dir(tmp_path)

    def predict(*args):
        assert cli.main(["plan", "--json", *args, "total_train_steps=20", "gconfig.max_new_tokens=96"]) == 0
        return json.loads(capsys.readouterr().out)

    own = predict("--hardware", profile)  # the profile has no lengths: half the cap, 48 tokens
    both = predict("--hardware", profile, "--from-run", str(run))
    run_only = predict("--from-run", str(run))
    assert both["step_time_s"] > own["step_time_s"]  # 60 tokens an answer, at the same costs
    assert both["step_time_s"] != pytest.approx(run_only["step_time_s"], rel=0.05)  # the profile's costs, not the run's


def test_a_run_is_fitted_with_its_own_epochs_and_a_torn_last_line_is_skipped(profile, tmp_path, capsys):
    """--from-run divides the run's training time by the passes it made (its config.yaml), not by those asked
    about: ppo_epochs=1 asked of a 4-epoch run predicts a quarter of its training, as a sweep does; a run still
    writing its metrics (a torn last line) is read."""
    run = _run_dir(tmp_path, '{"step": 6, "step_ti', step_time_s=9.0, trainer_fwd_bwd_s=8.0, trainer_recompute_s=0.5)
    (run / "config.yaml").write_text("actor:\n  ppo_epochs: 4\ngconfig:\n  n_samples: 8\n")

    def predict(*args):
        assert cli.main(["plan", "--json", "--from-run", str(run), *args, "gconfig.max_new_tokens=96"]) == 0
        return json.loads(capsys.readouterr().out)

    four, one = predict("actor.ppo_epochs=4"), predict("actor.ppo_epochs=1")
    assert one["step_time_s"] < 0.5 * four["step_time_s"]  # a quarter of the training, not the same


@pytest.mark.parametrize(
    "overrides, recompute, epochs",
    [
        ([], 0, 1),
        (["actor.ppo_n_minibatches=2"], 1, 1),
        (["actor.ppo_epochs=3"], 1, 3),
        (["actor.ppo_n_minibatches=2", "actor.prox_logp_method=loglinear"], 0, 1),
        (["actor.kl_ctl=0.1", "actor.ref_model=init"], 1, 1),  # the reference model's pass (it was left out)
        (["actor.kl_ctl=0.1", "actor.ref_model=init", "actor.ppo_n_minibatches=2"], 2, 1),
    ],
)
def test_the_plan_prices_the_proximal_recompute_only_where_the_trainer_runs_it(overrides, recompute, epochs):
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.launch.plan import workload
    from asyncrl.plan.calibrate import Fitted
    from asyncrl.plan.lengths import fixed

    fitted = Fitted(Profile("p", Costs(), ""), fixed(50), 24)
    w = workload(configlib.load(TrainConfig, None, overrides), fitted)
    assert (w.recompute, w.epochs) == (recompute, epochs)


def test_from_run_of_a_directory_that_is_not_a_run_says_so(tmp_path, capsys):
    (tmp_path / "sft_metrics.jsonl").write_text("{}\n")  # an asyncrl sft output
    assert cli.main(["plan", "--from-run", str(tmp_path)]) == 2
    assert "is not a run directory: it has no metrics.jsonl" in capsys.readouterr().err
