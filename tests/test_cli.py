"""The asyncrl command (asyncrl.cli): start-up refusals in one line that create nothing, and init-model's flags."""

import pytest

from asyncrl import cli
from asyncrl.cli import main

SHAPE = ["--hidden-size", "64", "--layers", "2"]


def test_corpus_and_task_are_alternatives(tmp_path, capsys):
    corpus = tmp_path / "paints.txt"
    corpus.write_text("mixing paint\n")
    with pytest.raises(SystemExit) as e:
        main(["init-model", "--corpus", str(corpus), "--task", "arith", "--out", str(tmp_path / "m")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--task" in err and "--corpus" in err


@pytest.mark.parametrize("flag, value", [("--hidden-size", "30"), ("--layers", "0"), ("--vocab-size", "100")])
def test_bad_shape_is_one_line(tmp_path, capsys, flag, value):
    corpus = tmp_path / "paints.txt"
    corpus.write_text("mixing paint\n")
    assert main(["init-model", "--corpus", str(corpus), "--out", str(tmp_path / "m"), *SHAPE, flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err


def _refusal(capsys, args, match):
    code = cli.main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err


def test_start_up_refusals_are_one_line_and_create_nothing(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    common = [f"output_dir={out}", "progress_bar=false", "report=false"]
    empty = tmp_path / "empty"
    empty.mkdir()
    notmodel = tmp_path / "notmodel"
    notmodel.mkdir()
    (notmodel / "README.md").write_text("hi")
    afile = tmp_path / "afile"
    afile.write_text("x")
    emptycfg = tmp_path / "emptycfg"
    emptycfg.mkdir()
    (emptycfg / "config.json").write_text("{}")
    _refusal(capsys, ["train", f"model.path={empty}", *common], "has no config.json")
    _refusal(capsys, ["train", f"model.path={notmodel}", *common], "has no config.json")
    _refusal(capsys, ["train", f"model.path={afile}", *common], "is a file")
    _refusal(capsys, ["train", f"model.path={emptycfg}", *common], "has no 'model_type'")
    _refusal(
        capsys,
        [
            "train",
            f"model.path={tiny_model_dir}",
            "rollout.backend=remote",
            "rollout.server_addrs=[127.0.0.1:9]",
            "rollout.server_startup_timeout_s=1",
            *common,
        ],
        "inference servers did not start",
    )
    assert not out.exists()  # nothing was created for a run that could not start
    _refusal(
        capsys,
        ["train", f"model.path={tiny_model_dir}", f"output_dir={afile}", "progress_bar=false"],
        "output_dir: cannot create the run directory",
    )
    _refusal(capsys, ["train", "actor.lr=1e9"], "above 1")
    _refusal(capsys, ["train", "gconfig.temperature=.nan"], "finite")
    _refusal(capsys, ["eval", "--model", str(empty)], "has no config.json")


HELP_TWICE = """
import sys
from asyncrl.cli import main
main(["train", "--help-config"])
print("TORCH_IMPORTED", "torch" in sys.modules)
"""


def test_help_config_is_kept_in_the_cache_and_later_calls_skip_torch(tmp_path):
    """--help-config's text is made once per source (importing the config tree, and torch, takes seconds) and
    printed from asyncrl's cache directory afterwards, identical."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", HELP_TWICE], env=env, capture_output=True, text=True, timeout=120)
        for _ in range(2)
    ]
    first, second = (r.stdout.rsplit("TORCH_IMPORTED", 1) for r in runs)
    assert "rollout.max_head_offpolicyness" in first[0] and first[0] == second[0]
    assert first[1].strip() == "True" and second[1].strip() == "False"
    assert len(list((tmp_path / "asyncrl" / "help-config").glob("train-*.txt"))) == 1


def test_help_config_without_a_writable_cache_still_prints(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a cache 'directory' under a file cannot be made
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert main(["sft", "--help-config"]) == 0
    assert "train_dataset" in capsys.readouterr().out


def test_http_clients_log_no_line_per_request(tmp_path, capsys):
    import logging

    logging.getLogger("httpx").setLevel(logging.NOTSET)
    main(["init-model", "--out", str(tmp_path / "m"), *SHAPE])
    assert all(logging.getLogger(name).getEffectiveLevel() == logging.WARNING for name in cli.QUIET_LOGGERS)


def test_only_the_command_being_run_imports_its_module():
    import subprocess
    import sys

    code = (
        "import sys; from asyncrl.cli import main\ntry: main(['report', '--help'])\nexcept SystemExit: pass\n"
        "print(sorted(m for m in ('asyncrl.server.cli', 'asyncrl.launch.plan', 'asyncrl.report.cli') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "RUN_DIR" in out and out.strip().splitlines()[-1] == "['asyncrl.report.cli']"


def test_a_weight_sync_failure_is_one_line_and_exit_1(monkeypatch, capsys):
    """Every engine server gone, or a server holding another run's weights: one line, no traceback."""
    from asyncrl.api.weights import WeightSyncError

    def fail(args):
        raise WeightSyncError("server http://127.0.0.1:9 serves weight version 2, from another run")

    monkeypatch.setattr(cli, "_dispatch", fail)
    assert main(["train"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "asyncrl train: stopped: server http://127.0.0.1:9 serves weight version 2, from another run"


def test_hostile_configs_and_reward_modules_are_one_line(tmp_path, capsys, monkeypatch):
    """What used to be tracebacks (or a 45 s wait): an int past 64 bits, a YAML alias that contains itself, a
    'billion laughs' file, a temperature below what sampling takes, a reward module with a syntax error or one
    that raises at import, and a batch that cannot be held in memory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop.yaml").write_text("a: &a [*a]\n")
    laughs = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )
    (tmp_path / "laughs.yaml").write_text(laughs)
    (tmp_path / "broken_reward.py").write_text("def score(prompt, completion, **_):\n    return 1 +\n")
    (tmp_path / "raising_reward.py").write_text("raise RuntimeError('no API key')\n")
    _refusal(capsys, ["train", "seed=99999999999999999999999999"], "'seed' must be a 64-bit integer")
    _refusal(capsys, ["train", "--config", "loop.yaml"], "loop.yaml")
    _refusal(capsys, ["train", "--config", "laughs.yaml"], "expands to more than 100000 values")
    _refusal(capsys, ["train", "gconfig.temperature=5e-5"], "gconfig.temperature must be >= 0.0001")
    _refusal(capsys, ["train", "reward.fn=broken_reward:score"], "syntax error at")
    _refusal(capsys, ["train", "reward.fn=raising_reward:score"], "raised RuntimeError: no API key")
    _refusal(capsys, ["train", "train_dataset.batch_size=99999999999999999999"], "64-bit integer")
    _refusal(capsys, ["train", "train_dataset.batch_size=999999999"], "cannot be held in memory")


def test_init_model_writes_over_its_own_output_only(tmp_path, capsys):
    """The same init-model command again writes over its earlier output; an --out holding anything else (a
    trained model's run files, a data directory) is refused, unless --force: one typo lost a trained model."""
    out = tmp_path / "m"
    assert main(["init-model", "--out", str(out), *SHAPE]) == 0
    assert main(["init-model", "--out", str(out), *SHAPE, "--seed", "1"]) == 0
    (out / "sft_metrics.jsonl").write_text("{}\n")
    before = (out / "model.safetensors").read_bytes()
    assert main(["init-model", "--out", str(out), *SHAPE, "--seed", "2"]) == 2
    assert "already holds sft_metrics.jsonl (not an earlier init-model output)" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == before
    assert main(["init-model", "--out", str(out), *SHAPE, "--seed", "2", "--force"]) == 0
    assert (out / "model.safetensors").read_bytes() != before
