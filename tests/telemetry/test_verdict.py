"""The verdict's rules (asyncrl/telemetry/verdict.py) on records with a known bottleneck: each names it with its
evidence and change; the bottleneck is the finding with the largest expected gain; learning-health rules;
SFT memorising; ``asyncrl diagnose`` on a run directory, text and JSON."""

import json

import pytest

from asyncrl.report.diagnose import main as diagnose_main
from asyncrl.telemetry.verdict import diagnose, diagnose_sft


def _steps(n: int = 10, **phases) -> list[dict]:
    """``n`` one-second steps; ``phases`` are seconds per step (trainer_wait_s=0.3, ...) and other fields."""
    base = {
        "step_time_s": 1.0,
        "trainer_fwd_bwd_s": 0.5,
        "gen_decode_s": 0.5,
        "groups_no_signal_frac": 0.1,
        "entropy": 0.3,
        "clip_frac": 0.0,
        "behav_weight_capped_frac": 0.0,
        "truncated_frac": 0.0,
        "response_len_max": 40,
        "response_len_mean": 30,
        "staleness_mean": 0.5,
    }
    return [{"step": 0, "eval_accuracy": 0.2}] + [{"step": i, **base, **phases} for i in range(1, n + 1)]


def _names(verdict) -> set[str]:
    return {f.name for f in verdict.findings}


@pytest.mark.parametrize(
    "phases, name, change",
    [
        (dict(gen_idle_gate_s=0.5, trainer_wait_s=0.02), "trainer-bound", "actor.threads"),
        (dict(trainer_wait_s=0.4, gen_idle_gate_s=0.2), "generator-bound", "raise η"),
        (dict(trainer_wait_s=0.4, gen_idle_gate_s=0.0), "generator-bound", "rollout.threads"),
        (
            dict(trainer_wait_s=0.4, episode_tool_s=5.0, episode_llm_gen_s=1.0, gen_idle_nowork_s=0.4),
            "tool-bound",
            "max_concurrent_rollouts",
        ),
        (dict(trainer_sync_s=0.3), "sync-bound", "weight_transport"),
        (dict(trainer_eval_s=0.1, trainer_save_s=0.1), "eval/checkpoint-bound", "evaluator.freq_steps"),
        (
            dict(reward_queue_s=0.6, reward_run_s=0.3, trainer_wait_s=0.3, gen_idle_gate_s=0.2),
            "reward-bound",
            "reward.workers",
        ),
        (dict(trainer_wait_s=0.4, response_len_max=300, response_len_mean=30), "long-tail-bound", "max_new_tokens"),
    ],
)
def test_a_planted_bottleneck_is_named_with_its_change(phases, name, change):
    verdict = diagnose(_steps(**phases), {"max_staleness": 2, "n_samples": 8, "workers": 1})
    found = {f.name: f for f in verdict.findings}
    assert name in found, verdict.lines()
    assert change in found[name].change and found[name].gain > 0
    assert any(name in line for line in verdict.lines())


def test_the_advice_fits_the_run_it_reads():
    """Off the CPU (machine.json) threads are not advised; at η = 0 a trainer that still waits is told η >= 1
    would hide it (not that a larger η would not help); a run already on the in-process transport or evaluating
    in the background is not told to switch to it."""

    def change(settings, **phases):
        verdict = diagnose(_steps(**phases), {"n_samples": 8, "workers": 1, **settings})
        return {f.name: f.change for f in verdict.findings}

    gpu = change({"max_staleness": 2, "device": "cuda"}, gen_idle_gate_s=0.5, trainer_wait_s=0.02)["trainer-bound"]
    assert "actor.threads" not in gpu and "ddp:dN" in gpu
    slow = change({"max_staleness": 2, "device": "cuda"}, trainer_wait_s=0.4)["generator-bound"]
    assert "rollout.threads" not in slow and "servers" in slow
    sync = change({"max_staleness": 0}, gen_idle_gate_s=0.5, trainer_wait_s=0.12)["trainer-bound"]
    assert "η >= 1" in sync and "would not help" not in sync
    assert "would not help" in change({"max_staleness": 2}, gen_idle_gate_s=0.5, trainer_wait_s=0.02)["trainer-bound"]
    done = change(
        {"max_staleness": 2, "transport": "inprocess", "eval_background": True, "save_background": True},
        trainer_sync_s=0.3,
        trainer_eval_s=0.1,
        trainer_save_s=0.1,
    )
    assert "weight_transport" not in done["sync-bound"] and "background" not in done["eval/checkpoint-bound"]


def test_the_first_step_is_never_read_even_when_it_is_the_only_one():
    """A run diagnosed after its first step (live, or a 1-step run): that step waited for the first batch
    whatever the settings, so nothing is judged on it."""
    verdict = diagnose(_steps(1, trainer_wait_s=0.9, reward_queue_s=5.0, reward_run_s=1.0), {"max_staleness": 2})
    assert verdict.bottleneck is None and verdict.account.steps == 0
    assert verdict.lines() == [
        "bottleneck: not judged yet (the rules read the training steps after the first, "
        "which waits for the first batch whatever the settings)"
    ]
    assert diagnose(_steps(2, trainer_wait_s=0.9), {"max_staleness": 2}).account.steps == 1


def test_tool_bound_evidence_counts_the_generators_idle_time_behind_the_gate_too():
    """At η = 0 the groups that may run sit in their tools: the generator's idle time is gate-closed time."""
    phases = dict(trainer_wait_s=0.6, episode_tool_s=5.0, episode_llm_gen_s=1.0, gen_decode_s=0.1, gen_idle_gate_s=0.85)
    found = {f.name: f for f in diagnose(_steps(**phases), {"max_staleness": 0}).findings}
    assert "idled 85% (0% with nothing to do, 85% behind the closed gate)" in found["tool-bound"].evidence


@pytest.mark.parametrize("cpu_split, lends", [("fixed", True), ("auto", False), (None, False)])
def test_a_trainer_bound_run_on_the_cpu_with_a_fixed_split_is_told_to_lend_it_the_idle_cores(cpu_split, lends):
    """The default run is trainer-bound with the engine idle ~60% behind the gate; the auto split took its step
    from 2.76 to 2.06 s. Suggested only where it applies (settings carry cpu_split there, absent elsewhere); where
    the cores are already shared, actor.threads (which the shared split does not read) is not suggested."""
    settings = {"max_staleness": 2} if cpu_split is None else {"max_staleness": 2, "cpu_split": cpu_split}
    change = diagnose(_steps(gen_idle_gate_s=0.6, trainer_wait_s=0.0), settings).bottleneck.change
    assert ("lend the generator's idle cores" in change) == lends
    assert not lends or "(60% of the time)" in change
    assert ("actor.threads" in change) == (cpu_split != "auto")
    assert ("already borrows the generator's core while it idles" in change) == (cpu_split == "auto")


@pytest.mark.parametrize("cpu_split", ["fixed", "auto"])
def test_a_generator_bound_run_sharing_the_cores_is_told_to_give_the_engine_every_core_with_fixed_threads(cpu_split):
    """The shared split keeps the engine at half the cores (asyncrl/cluster/cores.py), where rollout.threads is not
    read."""
    change = diagnose(_steps(trainer_wait_s=0.4, gen_idle_gate_s=0.0), {"max_staleness": 2, "cpu_split": cpu_split})
    assert "rollout.threads" in change.bottleneck.change
    assert ("cluster.cpu_split=fixed" in change.bottleneck.change) == (cpu_split == "auto")
    assert "rollout.backend=asyncrl:dN" in change.bottleneck.change


def test_the_bottleneck_is_the_finding_with_the_largest_gain():
    verdict = diagnose(_steps(trainer_wait_s=0.4, gen_idle_gate_s=0.2, trainer_eval_s=0.1, trainer_save_s=0.1))
    assert {"generator-bound", "eval/checkpoint-bound"} <= _names(verdict)
    assert verdict.bottleneck.name == "generator-bound"
    assert verdict.lines()[1].startswith("bottleneck: generator-bound")


def test_a_trainer_busy_publishing_weights_is_sync_bound():
    """The generator waits on the gate because the trainer is busy, but a third of that is publishing weights
    (bench/bottlenecks.py's sync case: the disk transport with a ~100M model): a faster transport saves more
    than more threads for the rest."""
    verdict = diagnose(
        _steps(
            gen_idle_gate_s=0.83, trainer_fwd_bwd_s=0.46, trainer_optim_s=0.2, trainer_sync_s=0.34, gen_decode_s=0.17
        )
    )
    assert {"trainer-bound", "sync-bound"} <= _names(verdict)
    assert verdict.bottleneck.name == "sync-bound"
    assert (
        diagnose(
            _steps(
                gen_idle_gate_s=0.83, trainer_fwd_bwd_s=0.8, trainer_optim_s=0.1, trainer_sync_s=0.1, gen_decode_s=0.17
            )
        ).bottleneck.name
        == "trainer-bound"
    )


def test_a_balanced_run_has_no_bottleneck():
    verdict = diagnose(_steps(trainer_wait_s=0.02, gen_idle_gate_s=0.05))
    assert verdict.bottleneck is None and "none found" in verdict.lines()[1]


def test_the_rules_read_the_last_steps_only():
    """A warm-up in which the trainer waited does not decide the verdict of a run that no longer waits."""
    records = _steps(5, trainer_wait_s=0.9) + _steps(25, gen_idle_gate_s=0.5)[1:]
    assert diagnose(records).bottleneck.name == "trainer-bound"


@pytest.mark.parametrize(
    "fields, name",
    [
        (dict(groups_no_signal_frac=0.9), "no learning signal"),
        (dict(entropy=0.001), "entropy collapse"),
        (dict(clip_frac=0.3), "clipping"),
        (dict(behav_weight_capped_frac=0.1), "behaviour cap"),
        (dict(truncated_frac=0.5), "truncation"),
        (dict(mismatch_abs_mean=0.05), "train/inference mismatch"),
        (dict(staleness_mean=1.9), "staleness at its bound"),
    ],
)
def test_learning_health(fields, name):
    assert name in _names(diagnose(_steps(**fields), {"max_staleness": 2}))
    assert name not in _names(diagnose(_steps(), {"max_staleness": 2}))


def test_an_auto_eta_is_read_per_step():
    assert "staleness at its bound" in _names(
        diagnose(_steps(staleness_mean=3.0, max_staleness=3), {"max_staleness": "auto"})
    )


def test_sft_that_memorised_its_data_is_named():
    records = [{"step": s, "loss": 0.0003, "eval_accuracy": 0.02 if s % 50 == 0 else None} for s in range(1, 301)]
    records[49]["eval_accuracy"] = 0.06  # the best held-out accuracy, early
    verdict = diagnose_sft([{k: v for k, v in r.items() if v is not None} for r in records])
    (finding,) = verdict.findings
    assert finding.name == "memorising" and "step 50" in finding.change
    fine = [{"step": s, "loss": 0.4, "eval_accuracy": 0.5} for s in range(1, 50)]
    assert not diagnose_sft(fine).findings


def test_diagnose_command_on_a_run_directory(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _steps(gen_idle_gate_s=0.5)))
    (tmp_path / "config.yaml").write_text("rollout:\n  max_head_offpolicyness: 2\ngconfig:\n  n_samples: 8\n")
    assert diagnose_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bottleneck: trainer-bound" in out and "now 8" in out
    assert diagnose_main([str(tmp_path), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["bottleneck"] == "trainer-bound" and verdict["settings"]["max_staleness"] == 2
    assert diagnose_main([str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "cluster, rollout, actor, lends",
    [
        ("cluster:\n  device: cpu\n  cpu_split: fixed\n", "local", "ddp:d1", True),
        ("cluster:\n  device: cpu\n  cpu_split: fixed\n", "local:d1", "ddp", True),  # other spellings of one each
        ("cluster:\n  device: cpu\n  cpu_split: auto\n", "local", "ddp:d1", False),
        (
            "cluster:\n  device: cpu\n  cpu_split: fixed\n",
            "remote",
            "ddp:d1",
            False,
        ),  # the engine is not in the process
        ("cluster:\n  device: cpu\n  cpu_split: fixed\n", "local", "ddp:d2", False),
        ("cluster:\n  device: cuda\n  cpu_split: fixed\n", "local", "ddp:d1", False),
    ],
)
def test_diagnose_reads_from_config_yaml_whether_the_auto_split_applies(
    tmp_path, capsys, cluster, rollout, actor, lends
):
    """Runs from before machine.json: the config says it (cluster.device=auto: the machine diagnosing decides)."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _steps(gen_idle_gate_s=0.5)))
    (tmp_path / "config.yaml").write_text(f"{cluster}rollout:\n  backend: {rollout}\nactor:\n  backend: {actor}\n")
    assert diagnose_main([str(tmp_path)]) == 0
    assert ("lend the generator's idle cores" in capsys.readouterr().out) == lends


@pytest.mark.parametrize(
    "machine, lends", [({"device": "cpu", "cpu_split": "fixed"}, True), ({"device": "cuda", "cpu_split": None}, False)]
)
def test_a_copied_run_is_judged_for_the_machine_it_ran_on(tmp_path, capsys, machine, lends):
    """cluster.device=auto in config.yaml; machine.json says where it resolved (here: not this machine's answer
    for the GPU run, whichever machine runs the test)."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _steps(gen_idle_gate_s=0.5)))
    (tmp_path / "config.yaml").write_text("cluster:\n  device: auto\n  cpu_split: fixed\nrollout:\n  backend: local\n")
    (tmp_path / "machine.json").write_text(json.dumps(machine))
    assert diagnose_main([str(tmp_path)]) == 0
    assert ("lend the generator's idle cores" in capsys.readouterr().out) == lends


def _evaluated(accuracies: list[float], items: int = 200, every: int = 10) -> list[dict]:
    """Training steps with an evaluation every ``every`` steps, of ``items`` items, giving ``accuracies`` in turn
    (the first at step 0, before training)."""
    records = _steps(n=every * (len(accuracies) - 1))
    for i, accuracy in enumerate(accuracies):
        records[i * every].update(eval_accuracy=accuracy, eval_items=items)
    return records


@pytest.mark.parametrize(
    "accuracies, items, falls",
    [
        ([0.265, 0.355, 0.385, 0.400, 0.440, 0.325, 0.360, 0.335, 0.330, 0.180, 0.165], 200, True),  # actor.lr=1e-4
        ([0.265, 0.455, 0.435, 0.440, 0.455, 0.400, 0.395, 0.400, 0.420, 0.400, 0.425], 200, False),  # 5e-5: noise
        ([0.265, 0.425, 0.435, 0.390, 0.405, 0.410, 0.395, 0.380, 0.335, 0.355, 0.405], 200, False),  # 7 points: noise
        ([0.265, 0.425, 0.435, 0.390, 0.405, 0.410, 0.395, 0.380, 0.335, 0.355, 0.345], 2000, True),  # on 2000 items
        ([0.265, 0.300, 0.350, 0.400, 0.450, 0.500], 200, False),  # rising
        ([0.5, 0.2, 0.2, 0.2], 200, True),  # below the starting model
    ],
)
def test_held_out_accuracy_falling_from_its_best_is_named(accuracies, items, falls):
    """Measured curves (the default run at two learning rates, 200 items: ±0.035 an evaluation) and made ones:
    the mean of the last three evaluations must be 4 standard errors (and 5 points) under the best before."""
    verdict = diagnose(_evaluated(accuracies, items), {"max_staleness": 2, "lr": 1e-4})
    found = {f.name: f for f in verdict.findings}
    assert ("held-out falling" in found) == falls, verdict.lines()
    if falls:
        best = max(range(len(accuracies) - 3), key=lambda i: accuracies[i])
        assert f"step {best * 10}" in found["held-out falling"].evidence
        assert "lower actor.lr, now 0.0001" in found["held-out falling"].change
        assert ("starting model" in found["held-out falling"].change) == (best == 0)


def test_a_run_without_evaluation_counts_is_not_judged_on_held_out_accuracy():
    """Runs from before ``eval_items`` was logged: the standard error is unknown, so the rule does not read them."""
    records = _evaluated([0.265, 0.440, 0.325, 0.180, 0.165])
    assert "held-out falling" in _names(diagnose(records, {"max_staleness": 2}))
    for r in records:
        r.pop("eval_items", None)
    assert "held-out falling" not in _names(diagnose(records, {"max_staleness": 2}))


def test_the_live_verdict_reads_the_evaluation_before_training_and_those_beside_it(caplog):
    """evaluator.background: an evaluation is logged on its own, steps after the version it scored; step 0's
    before training. Both reach the live verdict (they were only logged: held-out falling never fired live)."""
    from asyncrl.telemetry.watchdog import LiveVerdict, Watchdog

    watchdog = Watchdog(
        no_signal_steps=0,
        reward_failure_steps=0,
        max_nonfinite_steps=0,
        live=LiveVerdict({"max_staleness": 2, "lr": 1e-4}, every=10),
    )
    accuracy = {0: 0.480, 10: 0.300, 20: 0.280, 30: 0.270, 40: 0.260}
    watchdog.evaluated({"step": 0, "version": 0, "eval_accuracy": accuracy[0], "eval_items": 200})
    with caplog.at_level("WARNING", logger="asyncrl.telemetry.watchdog"):
        for record in _steps(50)[1:]:
            watchdog.check({**record, "version": record["step"]})
            scored = record["step"] - 1  # the evaluation of the previous version ends during this step
            if scored in accuracy and scored:
                watchdog.evaluated(
                    {
                        "step": scored,
                        "version": scored,
                        "evaluation": True,
                        "eval_accuracy": accuracy[scored],
                        "eval_items": 200,
                    }
                )
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("held-out falling")]
    assert (
        len(warnings) == 1 and "best 0.480 at step 0" in warnings[0] and "the starting model was better" in warnings[0]
    )


def test_the_live_verdict_warns_once_about_a_condition_that_persists_and_remembers_older_evaluations(caplog):
    """Checked every 10 steps over the last 20; a finding seen at two checks in a row is warned about once. The
    held-out rule sees the evaluations that have left the window (the best one was 60 steps before)."""
    from asyncrl.telemetry.watchdog import LiveVerdict

    live = LiveVerdict({"max_staleness": 2, "lr": 1e-4}, every=10)
    with caplog.at_level("WARNING", logger="asyncrl.telemetry.watchdog"):
        for record in _evaluated([0.265, 0.440, 0.325, 0.360, 0.180, 0.165, 0.170, 0.160, 0.150])[1:]:
            live.check(record)
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if w.startswith("held-out falling")]) == 1, warnings
    assert "best 0.440 at step 10" in next(w for w in warnings if w.startswith("held-out falling"))
    assert len(live.records) == 21  # the rules read 20 steps after the oldest


def test_the_live_verdict_warns_again_when_a_condition_comes_back_or_its_advice_changes(caplog, monkeypatch):
    """Once warned, a finding is quiet while it persists with the same advice (numbers aside); it warns again
    after it has cleared and persists anew, or when the change it suggests becomes another."""
    import asyncrl.telemetry.watchdog as watchdog
    from asyncrl.telemetry.verdict import Finding, Verdict

    def finding(change):
        return Finding("trainer-bound", "bottleneck", "gate closed 60%", change, 0.3)

    script = iter(
        [
            [finding("raise actor.threads to 2")],
            [finding("raise actor.threads to 2")],
            [finding("raise actor.threads to 3")],  # the same advice, another number: quiet
            [],
            [finding("raise actor.threads to 2")],
            [finding("raise actor.threads to 2")],  # back
            [finding("lower gconfig.n_samples to 4")],
        ]
    )  # another change
    monkeypatch.setattr(watchdog, "diagnose", lambda records, settings: Verdict(next(script), None, settings))
    live = watchdog.LiveVerdict({"max_staleness": 2}, every=1)
    with caplog.at_level("WARNING", logger="asyncrl.telemetry.watchdog"):
        for step in range(1, 8):
            live.check({"step": step, "version": step})
    warnings = [r.getMessage() for r in caplog.records]
    assert [w.split(" -> ")[1] for w in warnings] == [
        "raise actor.threads to 2",
        "raise actor.threads to 2",
        "lower gconfig.n_samples to 4",
    ], warnings


def test_diagnose_says_where_auto_ran_the_evaluation_as_machine_json_recorded(tmp_path, capsys):
    steps = _steps(trainer_eval_s=0.4)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (tmp_path / "config.yaml").write_text("evaluator:\n  background: auto\n")
    why = "auto: the trainer and the engine share all 2 cores (cluster.cpu_split=auto), so an evaluation ..."
    (tmp_path / "machine.json").write_text(
        json.dumps({"device": "cpu", "eval_background": False, "eval_background_why": why})
    )
    assert diagnose_main([str(tmp_path)]) == 0
    assert "evaluator.background=auto kept evaluation in the foreground" in capsys.readouterr().out


def test_a_burst_of_fast_reward_calls_queues_without_being_the_bottleneck():
    """The default run with shared prefixes: reward calls queued 3x as long as they ran, but the 2 workers ran calls
    3% of the time while the generator was busy 97%: generator-bound, not reward-bound."""
    steps = _steps(trainer_wait_s=0.26, reward_queue_s=0.18, reward_run_s=0.06, gen_decode_s=0.6, gen_reprefill_s=0.3)
    names = [f.name for f in diagnose(steps, {"max_staleness": 2, "workers": 2}).findings]
    assert "reward-bound" not in names and "generator-bound" in names
    assert "reward-bound" in [
        f.name
        for f in diagnose(_steps(trainer_wait_s=0.3, reward_queue_s=0.6, reward_run_s=0.6), {"workers": 2}).findings
    ]
