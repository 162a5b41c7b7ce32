"""Hostile run directories (red team 4, findings 8 and 16): `report`, `diagnose`, `diagnose --json` and
`plan --from-run --json` each answer a damaged file in one line with exit 2, never a traceback, and never
expand a YAML bomb."""

import json

import pytest

from asyncrl.cli import main as asyncrl_main
from asyncrl.configlib import MAX_YAML_NODES

from reports_for_tests import synthetic_run

COMMANDS = (["report"], ["diagnose"], ["diagnose", "--json"], ["plan", "--json", "--from-run"])

BOMB = "".join(
    [f"lol0: &l0 [{', '.join(['lol'] * 9)}]\n"]
    + [f"lol{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" for n in range(1, 10)]
    + ["rollout: {max_head_offpolicyness: *l9}\n", "gconfig: *l9\n"]
)  # 9 ** 10 values: a few hundred bytes standing for billions


def deep(n: int) -> str:
    return "[" * n + "]" * n


def _metrics_line(run, line: str) -> None:
    """``line`` as a middle line of ``metrics.jsonl`` (a torn last line is skipped on purpose)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:3] + [line] + lines[3:]) + "\n")


def _record(run, **values) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    record = {**json.loads(lines[2]), **values}
    (run / "metrics.jsonl").write_text("\n".join(lines[:2] + [json.dumps(record)] + lines[3:]) + "\n")


DAMAGES = {
    "config bomb": (lambda run: (run / "config.yaml").write_text(BOMB), f"more than {MAX_YAML_NODES} values"),
    "config 10,000 deep": (lambda run: (run / "config.yaml").write_text("a: " + deep(10_000) + "\n"), "config.yaml"),
    "actor: 7": (lambda run: (run / "config.yaml").write_text("actor: 7\n"), "'actor' must be a section"),
    "a list for a number": (
        lambda run: (run / "config.yaml").write_text("rollout: {max_head_offpolicyness: [1, 2]}\n"),
        "must be a number",
    ),
    "a 10,000-deep metrics line": (lambda run: _metrics_line(run, '{"a": ' + deep(10_000) + "}"), "metrics.jsonl:4"),
    "a 5000-digit integer": (lambda run: _metrics_line(run, '{"step": 3, "x": ' + "7" * 5000 + "}"), "metrics.jsonl:4"),
    "a step that is a string": (lambda run: _record(run, step="2"), "'step' must be an integer"),
    "a metric that is a mapping": (lambda run: _record(run, step_time_s={}), "'step_time_s' must be a number"),
    "a metric that is a list": (
        lambda run: _record(run, response_len_mean=[1]),
        "'response_len_mean' must be a number",
    ),
}
READ_PAST = ("actor: 7", "a metric that is a mapping", "a metric that is a list")
TOLERATED = {
    "report": READ_PAST,  # a value the summary and plots cannot read is left out, as NaN is
    "diagnose": READ_PAST,
    "plan": ("a list for a number",),  # the planner asks about the command line's rollout, not the run's
}
"""Damage a command may read past: a section of config.yaml that is not a mapping reads as absent there, a
metric that is not a number is skipped; the planner, which sums them, refuses it."""


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_damaged_run_directory_is_one_line(tmp_path, capsys, damage, command):
    run = synthetic_run(tmp_path)
    spoil, named = DAMAGES[damage]
    spoil(run)
    code, err = asyncrl_main([*command, str(run)]), capsys.readouterr().err
    assert "Traceback" not in err, err
    if damage in TOLERATED.get(command[0], ()):
        assert code == 0 or (code == 2 and err.count("\n") == 1), err  # a section it does not read
        return
    assert code == 2 and err.count("\n") == 1, err
    assert named in err, err


def test_a_timeline_of_the_wrong_type_is_one_line(tmp_path, capsys):
    run = synthetic_run(tmp_path)
    (run / "timeline.jsonl").write_text('{"type": "span", "kind": "train", "t0": "a", "t1": 2.0}\n{}\n')
    assert asyncrl_main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'t0' must be a number" in err and "timeline.jsonl" in err, err


def test_the_planner_refuses_counts_of_the_wrong_type(tmp_path, capsys):
    run = synthetic_run(tmp_path)
    (run / "config.yaml").write_text("actor: {ppo_epochs: '2'}\n")
    assert asyncrl_main(["plan", "--json", "--from-run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "actor.ppo_epochs must be a positive integer" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", COMMANDS[:3], ids=" ".join)
def test_the_lists_a_run_writes_are_read(tmp_path, capsys, command):
    """``staleness_hist`` is a list in every training record: the checks above must not refuse it."""
    run = synthetic_run(tmp_path)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "staleness_hist": [3, 1]}) + "\n" for r in rows))
    assert asyncrl_main([*command, str(run)]) == 0, capsys.readouterr().err
