"""``asyncrl eval``: pass@k and mean@n over n samples per prompt, the per-item JSONL, reproducible sampling,
one-line refusals, and a LoRA adapter directory evaluated as its base model with the adapter merged."""

import json
import math

import pytest
import torch

from asyncrl.cli import main
from asyncrl.commands.eval import pass_at_k, summarize

REWARD = "reward.fn=rewards_for_tests:even_length_reward"


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 0, 2, 0.0),
        (4, 4, 1, 1.0),
        (10, 3, 1, 0.3),  # pass@1 is the success rate c/n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (3, 1, 3, 1.0),  # n - c < k: every draw of k holds the success
        (8, 2, 4, 1 - 15 / 70),  # 1 - C(6,4)/C(8,4)
    ],
)
def test_pass_at_k_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, 1, 5), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_summary_averages_over_prompts():
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.5, 0.0]]  # 0.5 is below the success threshold of 1.0
    out = summarize(rewards, [1, 2])
    assert out["pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert out["pass@2"] == pytest.approx((0.5 + (1 - 1 / 6)) / 2)
    assert out["mean@4"] == pytest.approx((0.25 + 0.625) / 2)
    assert out["eval_accuracy"] == out["pass@1"] and out["eval_reward_mean"] == out["mean@4"]


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"Compute {i} + 2.", "answer": str(i + 2), "source": "ab"[i % 2]})
            + "\n"
            for i in range(4)
        )
    )
    return path


def _eval(capsys, model, data, *extra) -> tuple[int, dict | None, str]:
    rc = main(
        [
            "eval",
            "--model",
            model,
            f"valid_dataset.path={data}",
            "reward.workers=0",
            "gconfig.max_new_tokens=8",
            "threads=1",
            *extra,
        ]
    )
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return rc, (json.loads(lines[-1]) if rc == 0 else None), captured.err


def _read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_samples_n_per_prompt_and_writes_every_item(tmp_path, tiny_model_dir, questions, capsys):
    out = tmp_path / "new" / "dir" / "results.jsonl"  # the parent directory is created
    rc, record, err = _eval(
        capsys,
        tiny_model_dir,
        questions,
        REWARD,
        "gconfig.n_samples=4",
        "evaluator.greedy=false",
        "k=[1,2,4]",
        "seed=3",
        f"output={out}",
    )
    assert rc == 0, err
    assert record["n"] == 4 and record["n_samples"] == 4 and record["output"] == str(out)
    assert {
        "pass@1",
        "pass@2",
        "pass@4",
        "mean@4",
        "eval_accuracy",
        "eval_reward_mean",
        "eval_reward_errors",
        "eval_len_mean",
    } <= set(record)
    assert record["eval_accuracy"] == record["pass@1"] and record["eval_reward_errors"] == 0
    items = _read(out)
    assert [it["index"] for it in items] == [0, 1, 2, 3]
    assert [it["id"] for it in items] == ["q0", "q1", "q2", "q3"]
    assert [it["question"] for it in items] == [f"Compute {i} + 2." for i in range(4)]
    assert [it["answer"] for it in items] == ["2", "3", "4", "5"]
    for it in items:
        assert len(it["completions"]) == len(it["rewards"]) == 4
        assert it["rewards"] == [float(len(t) % 2 == 0) for t in it["completions"]]  # the configured reward.fn
        assert it["n_correct"] == sum(r >= 1.0 for r in it["rewards"])
        for k in (1, 2, 4):
            assert it[f"pass@{k}"] == pytest.approx(pass_at_k(4, it["n_correct"], k))
    for k in (1, 2, 4):
        assert record[f"pass@{k}"] == pytest.approx(sum(it[f"pass@{k}"] for it in items) / 4)
    assert record["mean@4"] == pytest.approx(sum(sum(it["rewards"]) / 4 for it in items) / 4)
    assert [it["source"] for it in items] == ["a", "b", "a", "b"]
    for name in "ab":  # per source, over its samples, as the trainer's evaluation reports it
        mine = [it for it in items if it["source"] == name]
        assert record[f"eval_accuracy/{name}"] == pytest.approx(sum(it["n_correct"] for it in mine) / 8)
    assert 0 < record["pass@1"] < 1, "the test reward should leave successes and failures to count"


def test_eval_is_reproducible_with_a_seed(tmp_path, tiny_model_dir, questions, capsys):
    runs = {}
    for name, seed in [("a", 5), ("b", 5), ("c", 6)]:
        rc, record, err = _eval(
            capsys,
            tiny_model_dir,
            questions,
            REWARD,
            "gconfig.n_samples=3",
            "evaluator.greedy=false",
            "k=[1,3]",
            f"seed={seed}",
            f"output={tmp_path / name}.jsonl",
        )
        assert rc == 0, err
        runs[name] = ([it["completions"] for it in _read(tmp_path / f"{name}.jsonl")], record["pass@3"])
    assert runs["a"] == runs["b"]
    assert runs["a"][0] != runs["c"][0]  # another seed draws other samples
    completions = runs["a"][0]
    assert any(len(set(group)) > 1 for group in completions), "the n samples of a prompt should differ"


def test_eval_reads_top_k_and_the_success_threshold(tmp_path, tiny_model_dir, questions, capsys):
    """gconfig.top_k=1 samples the most likely token every time; evaluator.success_threshold counts a reward of
    0.5 as a success (both were accepted and ignored)."""
    rc, _, err = _eval(
        capsys,
        tiny_model_dir,
        questions,
        REWARD,
        "gconfig.n_samples=4",
        "evaluator.greedy=false",
        "gconfig.top_k=1",
        f"output={tmp_path / 'k1.jsonl'}",
    )
    assert rc == 0, err
    assert all(len(set(it["completions"])) == 1 for it in _read(tmp_path / "k1.jsonl"))
    half = ["reward.fn=rewards_for_tests:scale_reward", "reward.kwargs={scale: 0.5}"]
    for threshold, accuracy in [(1.0, 0.0), (0.5, 1.0)]:
        rc, record, err = _eval(capsys, tiny_model_dir, questions, *half, f"evaluator.success_threshold={threshold}")
        assert rc == 0, err
        assert record["eval_accuracy"] == record["pass@1"] == accuracy and record["eval_accuracy/a"] == accuracy


def test_a_prompt_limit_beyond_the_engines_room_is_refused_naming_it(tiny_model_dir, questions, capsys):
    """As training refuses it: eval passed prompts the engine could not hold and ended in a bare ValueError."""
    rc, _, err = _eval(capsys, tiny_model_dir, questions, REWARD, "train_dataset.max_prompt_tokens=100000")
    assert rc == 2 and "train_dataset.max_prompt_tokens=100000 exceeds" in err


def test_the_context_is_the_trainings_not_a_fixed_1024(tiny_model_dir):
    from asyncrl.engine.config import builtin_context

    assert builtin_context(32768, 1024) == 2048 and builtin_context(32768, 64) == 1024 and builtin_context(512) == 512


def test_greedy_single_answer_keeps_the_old_record(tmp_path, tiny_model_dir, questions, capsys):
    rc, record, err = _eval(capsys, tiny_model_dir, questions, REWARD, "output=")
    assert rc == 0, err
    assert record["n_samples"] == 1 and record["eval_accuracy"] == record["pass@1"]
    assert record["eval_reward_mean"] == record["mean@1"] and "output" not in record


def test_training_file_alone_evaluates_its_held_out_split(tmp_path, tiny_model_dir, capsys):
    """valid_dataset.path empty: the rows held out of train_dataset.path (a tenth), as training holds them out."""
    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"Compute {i} + 1.", "answer": str(i + 1)}) + "\n" for i in range(30))
    )
    rc = main(
        [
            "eval",
            "--model",
            tiny_model_dir,
            f"train_dataset.path={path}",
            "reward.workers=0",
            "gconfig.max_new_tokens=4",
            "threads=1",
            REWARD,
            f"output={tmp_path / 'r.jsonl'}",
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == 3
    assert len(_read(tmp_path / "r.jsonl")) == 3


@pytest.mark.parametrize(
    "extra, named",
    [
        (["gconfig.n_samples=4"], ["gconfig.n_samples", "evaluator.greedy"]),  # greedy is the default
        (["gconfig.n_samples=2", "evaluator.greedy=false", "k=[1,4]"], ["k", "gconfig.n_samples"]),
        (["k=[0]"], ["k"]),
    ],
)
def test_eval_refuses_impossible_sampling_in_one_line(tmp_path, questions, capsys, extra, named):
    rc, _, err = _eval(capsys, "builtin:tiny-sft", questions, *extra, f"output={tmp_path / 'r.jsonl'}")
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and all(word in err for word in named), err
    assert not (tmp_path / "r.jsonl").exists()


def _adapter(tmp_path, base_dir):
    """A LoRA adapter on ``base_dir`` with non-zero B (so merging changes the weights), saved by peft."""
    from peft import LoraConfig, get_peft_model

    from asyncrl.models.hf import load_model

    torch.manual_seed(0)
    model = get_peft_model(
        load_model(base_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    path = tmp_path / "adapter"
    model.save_pretrained(path)
    return path, model


def test_lora_adapter_directory_is_evaluated_merged(tmp_path, tiny_model_dir, questions, capsys):
    pytest.importorskip("peft")
    from asyncrl.models.hf import load_checkpoint, load_model

    path, peft_model = _adapter(tmp_path, tiny_model_dir)
    assert (path / "adapter_config.json").exists() and not (path / "config.json").exists()
    tokenizer, merged = load_checkpoint(str(path))
    ids = torch.tensor([tokenizer("Compute 1 + 2.").input_ids])
    with torch.no_grad():
        expected = peft_model.eval()(ids).logits
        base = load_model(tiny_model_dir)(ids).logits
        got = merged(ids).logits
    assert torch.allclose(got, expected, atol=1e-4) and not torch.allclose(got, base, atol=1e-3)
    assert not any("lora" in name for name in merged.state_dict())
    rc, record, err = _eval(capsys, str(path), questions, REWARD, "output=")
    assert rc == 0 and record["n"] == 4, err


def test_lora_adapter_without_its_base_is_one_line(tmp_path, tiny_model_dir, questions, capsys):
    pytest.importorskip("peft")
    path, _ = _adapter(tmp_path, tiny_model_dir)
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "/nowhere/base"}))
    rc, _, err = _eval(capsys, str(path), questions, "output=")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "base model" in err and "/nowhere/base" in err, err


def test_unbiased_estimator_matches_brute_force():
    """pass@k is the chance that a random k-subset of the n samples holds a success."""
    from itertools import combinations

    n, successes = 6, {1, 4}
    for k in range(1, n + 1):
        subsets = list(combinations(range(n), k))
        brute = sum(bool(successes & set(s)) for s in subsets) / len(subsets)
        assert pass_at_k(n, len(successes), k) == pytest.approx(brute)
        assert math.isclose(brute, 1 - math.comb(n - 2, k) / math.comb(n, k))


def test_eval_command_scores_a_file_with_the_configured_reward(tmp_path, tiny_model_dir, capsys):
    """``asyncrl eval --model M valid_dataset.path=F reward.fn=...``: the file alone (no training source) is
    evaluated with reward.fn, and a failing reward scores reward.default; the built-in task stays the default."""
    import json

    from asyncrl.cli import main

    path = tmp_path / "test.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"Compute {i} + 1.", "answer": str(i + 1)}) + "\n" for i in range(5))
    )
    common = ["eval", "--model", tiny_model_dir, "gconfig.max_new_tokens=4", "threads=1"]
    assert (
        main(
            common
            + [
                f"valid_dataset.path={path}",
                "valid_dataset.size=3",
                "reward.fn=data_fixtures.reward_fns:raising",
                "reward.default=0.25",
                "reward.workers=0",
            ]
        )
        == 0
    )
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["n"] == 3 and record["eval_reward_errors"] == 3 and record["eval_reward_mean"] == 0.25
    assert record["eval_accuracy"] == 0.0  # reward.default=0.25 is below evaluator's success threshold of 1.0
    assert main(common + ["valid_dataset.size=2", "reward.workers=1"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["n"] == 2 and record["eval_reward_errors"] == 0 and 0.0 <= record["eval_accuracy"] <= 1.0
    assert main(common + [f"valid_dataset.path={tmp_path / 'missing.jsonl'}"]) == 2
    assert "valid_dataset.path" in capsys.readouterr().err


def test_eval_reports_the_rows_it_skipped(tmp_path, tiny_model_dir, capsys, caplog):
    """A malformed line and a prompt longer than train_dataset.max_prompt_tokens are skipped, and the summary
    says so (the evaluation ran on fewer rows than the file has)."""
    rows = [json.dumps({"question": f"Compute {i} + 2.", "answer": str(i + 2)}) for i in range(3)]
    rows.insert(1, '{"question": "cut off')
    rows.append(json.dumps({"question": "Compute " + " + ".join(["1"] * 200) + ".", "answer": "200"}))
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(rows) + "\n")
    rc, record, err = _eval(capsys, tiny_model_dir, path, REWARD, "train_dataset.max_prompt_tokens=100")
    assert rc == 0, err
    assert record["n"] == 3 and record["data_bad_rows"] == 1 and record["data_skipped_long"] == 1
    assert "1 malformed (data_bad_rows), 1 with a prompt over 100 tokens" in caplog.text
