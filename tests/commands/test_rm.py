"""Reward models: ``asyncrl rm`` trains one on preference pairs with a known preference (answers over refusals),
``reward.model`` scores with it (batched, in the run's process), and an RL run trains on its scores."""

import codecs
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from asyncrl import cli, configlib
from asyncrl.commands.rm import check_output, read_pairs
from asyncrl.config import RMConfig, TrainConfig
from asyncrl.configlib import ConfigError


def _pairs(path, n, seed=0):
    """Pairs whose preference is known: the worked answer over a refusal."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 60), rng.randint(1, 60)
        rows.append(
            {
                "prompt": f"Compute {a} + {b}.",
                "chosen": f"{a} + {b} = {a + b}\nThe answer is {a + b}.",
                "rejected": rng.choice(["I do not know.", "No.", "I cannot answer that."]),
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "line,said",
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"prompt": "p", "chosen": "c"}', "missing or not text: rejected"),
        (b'{"question": "p", "chosen": 3, "rejected": "r"}', "chosen"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),  # was a RecursionError's traceback
        ('{"prompt": "caf\u00e9", "chosen": "c", "rejected": "r"}'.encode("latin-1"), "not UTF-8"),
    ],
)
def test_a_bad_pair_is_refused_naming_the_file_and_line(tmp_path, line, said):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b'{"prompt": "p", "chosen": "c", "rejected": "r"}\n' + line + b"\n")
    with pytest.raises(ConfigError, match=f"pairs.jsonl:2: .*{said}"):
        read_pairs(str(path))


def test_pairs_are_read_as_the_datasets_are(tmp_path):
    """A byte-order mark and a line separator or NEL inside a string are valid JSON Lines (they were refused)."""
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": "a\u2028b", "chosen": "c\u0085d", "rejected": "r"},
        {"question": "q", "chosen": "c", "rejected": "r"},
    ]
    path.write_bytes(codecs.BOM_UTF8 + "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    assert read_pairs(str(path)) == [("a\u2028b", "c\u0085d", "r"), ("q", "c", "r")]


def test_rm_needs_a_pairs_file():
    with pytest.raises(ConfigError, match="train_dataset.path: asyncrl rm needs a JSONL file"):
        configlib.load(RMConfig, None, []).validate()


def test_rm_refuses_an_output_dir_that_holds_another_model(tmp_path, capsys):
    """A policy checkpoint or the model to train from is never overwritten by the reward model (red team 4);
    an earlier rm output is (a rerun); an lr above 1 is refused as train refuses it (it saved a NaN model)."""
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    pairs = _pairs(tmp_path / "pairs.jsonl", 4)
    for out, said in ((policy, "holds a model that asyncrl rm did not write"), (policy, "holds the model to train")):
        model = str(policy if "train" in said else "builtin:tiny-sft")
        assert cli.main(["rm", f"train_dataset.path={pairs}", f"model.path={model}", f"output_dir={out}"]) == 2
        assert said in capsys.readouterr().err
        assert sorted(p.name for p in policy.iterdir()) == ["config.json"]  # nothing written there
    assert cli.main(["rm", f"train_dataset.path={pairs}", "actor.lr=1e30", f"output_dir={tmp_path / 'rm'}"]) == 2
    assert "actor.lr=1e+30 is above 1" in capsys.readouterr().err and not (tmp_path / "rm").exists()
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "config.json").write_text("{}")
    (earlier / "rm_metrics.jsonl").write_text("")
    check_output(earlier, "builtin:tiny-sft")  # an earlier reward model of this command: replaced


@pytest.mark.parametrize(
    "override,said",
    [
        ("reward.model=builtin:tiny-sft", "the built-in models are language models, not reward models"),
        ("reward.model_device=cuda:banana", "reward.model_device must be cpu, cuda or cuda:N, got 'cuda:banana'"),
    ],
)
def test_a_reward_model_setting_that_cannot_work_is_refused_at_load(override, said):
    with pytest.raises(ConfigError, match=said):
        configlib.load(TrainConfig, None, [override])


def test_a_missing_reward_model_directory_is_named_not_taken_for_a_hub_name(tmp_path):
    from asyncrl.reward.model import load_reward_model

    for path in (str(tmp_path / "nothing"), "./nothing-here", "a/b/c"):
        with pytest.raises(ConfigError, match=f"reward.model: '{path}' is not a directory .*never downloaded"):
            load_reward_model(path)


@pytest.fixture(scope="module")
def trained_rm(tmp_path_factory, tokenizer):
    """``asyncrl rm`` on 200 pairs from a random tiny model (40 steps of 16 pairs): (output dir, its records)."""
    from asyncrl.models.hf import build_tiny_model

    tmp = tmp_path_factory.mktemp("rm")
    base = tmp / "base"
    build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128).save_pretrained(base)
    tokenizer.save_pretrained(base)
    pairs = _pairs(tmp / "pairs.jsonl", 200)
    out = tmp / "rm-out"
    code = cli.main(
        [
            "rm",
            f"model.path={base}",
            f"train_dataset.path={pairs}",
            f"output_dir={out}",
            "total_train_steps=40",
            "train_dataset.batch_size=16",
            "actor.lr=1e-3",
            "valid_dataset.size=40",
            "evaluator.freq_steps=20",
            "actor.threads=1",
        ]
    )
    assert code == 0
    return out, [json.loads(line) for line in (out / "rm_metrics.jsonl").read_text().splitlines()]


def test_rm_learns_a_known_preference_and_saves_a_reward_model(trained_rm):
    out, records = trained_rm
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(out).config.num_labels == 1
    evals = [r for r in records if "eval_pair_accuracy" in r]
    assert [r["step"] for r in evals] == [0, 20, 40]
    assert evals[-1]["eval_pair_accuracy"] >= 0.95 and evals[-1]["eval_margin_mean"] > evals[0]["eval_margin_mean"]
    assert records[-1]["loss"] < records[1]["loss"]


def test_a_text_longer_than_max_length_loses_its_prompts_start_not_its_answer(trained_rm):
    """Two responses after a prompt longer than max_length: cut at the end, both would be the same tokens."""
    from asyncrl.reward.model import load_reward_model, pair_text, scores

    tokenizer, model = load_reward_model(str(trained_rm[0]))
    prompt = "Compute 1 + 1. " * 60
    with torch.no_grad():
        good, bad = scores(
            model, tokenizer, [pair_text(prompt, "The answer is 2."), pair_text(prompt, "I refuse.")], max_length=32
        ).tolist()
    assert good != bad


def test_reward_model_scores_answers_above_refusals_in_batches(trained_rm, monkeypatch):
    from asyncrl.reward import build_reward_service
    from asyncrl.reward import model as model_module
    from asyncrl.reward.config import RewardConfig

    out, _ = trained_rm
    from asyncrl.reward.math_reward import math_reward

    service = build_reward_service(
        configlib.load(RewardConfig, None, [f"model={out}", "model_batch_size=8"]), math_reward
    )  # the data's verifier
    model = service.fn.model
    real_scores, first = model_module.scores, threading.Event()

    def slow_first_batch(*args):  # holds the first batch until other calls wait, as on a busy model
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + 10
            while model._calls.qsize() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_scores(*args)

    monkeypatch.setattr(model_module, "scores", slow_first_batch)
    try:
        items = [{"id": i, "question": f"Compute {i} + {i + 3}.", "answer": str(2 * i + 3)} for i in range(61, 69)]
        got = {}

        def score(i, item, text):
            got[i] = service.score(item, text)

        threads = [
            threading.Thread(target=score, args=(2 * k + j, it, text))
            for k, it in enumerate(items)
            for j, text in enumerate([f"{k} + 3 = {it['answer']}\nThe answer is {it['answer']}.", "I do not know."])
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(got[2 * k] > got[2 * k + 1] for k in range(len(items))), got
        assert model.scored == 16 and model.batches < 16  # calls that waited together were scored together
        assert service.stats()["reward_errors"] == 0
        it = items[0]  # held-out accuracy is the verifier's, not the model's unbounded score
        assert service.eval_fn(it["question"], f"The answer is {it['answer']}.", answer=it["answer"]) == 1.0
        assert service.eval_fn(it["question"], "I do not know.", answer=it["answer"]) == 0.0
    finally:
        service.close()


@pytest.mark.slow
def test_an_rl_run_trains_on_the_reward_models_scores(trained_rm, tmp_path, tiny_model_dir):
    from asyncrl.config import TrainConfig
    from asyncrl.launch.train import train
    from asyncrl.telemetry.metrics import read_metrics

    from runs_for_tests import prompt_files

    out, _ = trained_rm
    train_file, valid_file = prompt_files(tmp_path, 40)
    train(
        configlib.load(
            TrainConfig,
            None,
            [
                f"model.path={tiny_model_dir}",
                f"output_dir={tmp_path}",
                f"train_dataset.path={train_file}",
                f"valid_dataset.path={valid_file}",
                "train_dataset.type=qa",
                "total_train_steps=2",
                "train_dataset.batch_size=2",
                "gconfig.n_samples=2",
                "gconfig.max_new_tokens=8",
                "rollout.max_slots=8",
                "evaluator.freq_steps=0",
                "progress_bar=false",
                "report=false",
                f"reward.model={out}",
            ],
        )
    )
    records = [r for r in read_metrics(tmp_path / "asyncrl" / "default") if r["step"] > 0]
    assert len(records) == 2 and records[-1]["reward_errors"] == 0
    rewards = {r["reward_mean"] for r in records}
    assert not rewards <= {0.0, 1.0}  # the model's real-valued scores, not the verifier's 0/1


def test_a_language_model_is_not_a_reward_model_nor_the_reverse(trained_rm, tiny_model_dir):
    """reward.model of an ordinary causal LM would score with a new, random head (an RL run optimising noise,
    exit 0): refused; a reward model as model.path would generate with a random lm_head: refused too."""
    from asyncrl.configlib import ConfigError
    from asyncrl.models.hf import load_model
    from asyncrl.reward.model import RewardModel

    with pytest.raises(ConfigError, match="is not a reward model .*train one with asyncrl rm"):
        RewardModel(str(tiny_model_dir))
    out, _ = trained_rm
    with pytest.raises(ConfigError, match="is a reward model .*not a language model to generate with"):
        load_model(str(out))


def test_a_language_model_renamed_a_classifier_is_refused(tmp_path, tiny_model_dir):
    """A causal LM whose config.json was edited to name a sequence classifier loaded with a new, random score head
    and scored silently (red team 4): the head missing from the weights is said."""
    import shutil

    from asyncrl.reward.model import RewardModel

    edited = tmp_path / "edited"
    shutil.copytree(tiny_model_dir, edited)
    config = json.loads((edited / "config.json").read_text())
    config["architectures"] = [config["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")]
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="has no trained score head .*weights lack score.weight"):
        RewardModel(str(edited))


def test_a_classifier_of_three_outputs_or_a_device_this_machine_lacks_is_one_line(tmp_path, tiny_model_dir):
    """Both were tracebacks (red team 4, finding 18)."""
    import shutil

    from transformers import AutoConfig, AutoModelForSequenceClassification

    from asyncrl.reward.model import load_reward_model

    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.num_labels, config.architectures = (
        3,
        [config.architectures[0].replace("ForCausalLM", "ForSequenceClassification")],
    )
    three = tmp_path / "three"
    AutoModelForSequenceClassification.from_config(config).save_pretrained(three)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (Path(tiny_model_dir) / name).exists():
            shutil.copy(Path(tiny_model_dir) / name, three / name)
    with pytest.raises(ConfigError, match="has a score head of 3 outputs; a reward model has one"):
        load_reward_model(str(three))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="reward.model_device=cuda: this machine has no CUDA device"):
            load_reward_model(str(three), device="cuda")
