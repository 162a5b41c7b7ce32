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
    _refusal(capsys, ["train", f"model.path={tiny_model_dir}", "rollout.backend=remote",
                      "rollout.server_addrs=[127.0.0.1:9]", "rollout.server_startup_timeout_s=1", *common],
             "inference servers did not start")
    assert not out.exists()  # nothing was created for a run that could not start
    _refusal(capsys, ["train", f"model.path={tiny_model_dir}", f"output_dir={afile}", "progress_bar=false"],
             "output_dir: cannot create the run directory")
    _refusal(capsys, ["train", "actor.lr=1e9"], "above 1")
    _refusal(capsys, ["train", "gconfig.temperature=.nan"], "finite")
    _refusal(capsys, ["eval", "--model", str(empty)], "has no config.json")
