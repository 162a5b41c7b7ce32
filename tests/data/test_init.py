"""Datasets (asyncrl.data): held-out rows are never trained on (a one-row file is refused, an overlapping held-out file
is warned about), the plain-argument API, and training mixtures: sources interleaved by weight, resumed in place,
held out by weight, each reported on in a run."""

import collections
import itertools
import json
import logging
from pathlib import Path

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data import file_dataset, hold_out, split_sizes, task_dataset
from asyncrl.reward.base import item_fields
from asyncrl.data.config import (
    TaskConfig,
    TrainDatasetConfig,
    ValidDatasetConfig,
    dataset_from_config,
    eval_set_from_config,
    source_lookup,
)
from datasets_for_tests import ROWS, build, take, write_jsonl


def _file(tmp_path, name: str, n: int, offset: int = 0) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"question": f"{name}: compute {i} + 1.", "answer": str(i + 1)}) + "\n"
                            for i in range(offset, offset + n)))
    return str(path)


def _cfg(*overrides) -> TrainConfig:
    return configlib.load(TrainConfig, None, list(overrides))


def _mixture(entries: list[dict], *overrides) -> TrainConfig:
    return _cfg(f"train_dataset.mixture={json.dumps(entries)}", *overrides)


def _data(cfg: TrainConfig):
    return dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)


def _two_files(tmp_path, *overrides, a: dict | None = None, b: dict | None = None) -> TrainConfig:
    return _mixture([{"path": _file(tmp_path, "alpha", 60), "weight": 3, **(a or {})},
                     {"path": _file(tmp_path, "beta", 60, offset=500), **(b or {})}],
                    "valid_dataset.size=6", *overrides)


def test_weights_seed_ids_and_tags(tmp_path):
    cfg = _two_files(tmp_path)
    data = _data(cfg)
    items = list(itertools.islice(data.train, 2000))
    counts = collections.Counter(it["source"] for it in items)
    assert set(counts) == {"alpha", "beta"}  # names derived from the file stems
    assert abs(counts["alpha"] / 2000 - 0.75) < 0.04
    assert [it["id"] for it in items] == list(range(2000))  # unique integer ids across sources
    assert all(it["question"].startswith(it["source"] + ":") for it in items)  # tagged with where it came from
    lookup = source_lookup(cfg.train_dataset)
    assert all(lookup(it["id"]) == it["source"] == data.source_of(it["id"]) for it in items)
    again = list(itertools.islice(_data(cfg).train, 2000))
    assert [(it["question"], it["source"]) for it in again] == [(it["question"], it["source"]) for it in items]
    other = list(itertools.islice(_data(_two_files(tmp_path, "train_dataset.seed=1")).train, 200))
    assert [it["source"] for it in other] != [it["source"] for it in items[:200]]
    assert set(data.stats()) >= {"data_bad_rows", "data_epoch", "data_bad_rows/alpha", "data_epoch/beta"}


def test_resume_skips_the_drawn_items_and_continues_in_place(tmp_path):
    """A resumed run rebuilds the stream and skips the items its checkpoint drew (launch.build:
    islice(data.train, drawn, None)): the mixture must go on with exactly the items that came next."""
    cfg = _two_files(tmp_path)
    whole = list(itertools.islice(_data(cfg).train, 450))  # past an epoch of alpha's 54 training rows
    resumed = list(itertools.islice(itertools.islice(_data(cfg).train, 300, None), 150))
    assert resumed == whole[300:]


def test_held_out_is_split_by_weight_and_never_trained_on(tmp_path):
    cfg = _mixture([{"name": "big", "path": _file(tmp_path, "big", 200), "weight": 1},
                    {"name": "task", "path": "builtin:arith", "weight": 2}], "valid_dataset.size=12")
    data = _data(cfg)
    assert collections.Counter(it["source"] for it in data.valid) == {"big": 4, "task": 8}
    held_out = {it["question"] for it in data.valid}
    assert not held_out & {it["question"] for it in itertools.islice(data.train, 600)}
    assert split_sizes(10, [1, 1, 1]) == [4, 3, 3] and split_sizes(2, [1, 1, 1]) == [1, 1, 1]
    assert sum(split_sizes(200, [0.3, 1.7, 5.0])) == 200


def test_a_file_source_can_have_its_own_held_out_file(tmp_path):
    valid = _file(tmp_path, "alpha_test", 5, offset=900)
    cfg = _two_files(tmp_path, a={"valid_path": valid})
    data = _data(cfg)
    alpha_valid = [it["question"] for it in data.valid if it["source"] == "alpha"]
    assert alpha_valid and all("compute 9" in q for q in alpha_valid)


@pytest.mark.slow
def test_train_on_a_two_source_mixture_reports_each_source(tmp_path, tiny_model_dir):
    from asyncrl.launch.train import train
    from asyncrl.telemetry.metrics import read_metrics

    entries = [{"name": "ones", "path": _file(tmp_path, "ones", 30), "reward_fn": "rewards_for_tests:one_reward"},
               {"name": "zeros", "path": _file(tmp_path, "zeros", 30, offset=100), "weight": 2,
                "reward_fn": "rewards_for_tests:constant_reward"}]
    cfg = _mixture(entries, f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "progress_bar=false",
                   "report=false", "total_train_steps=3", "train_dataset.batch_size=4", "gconfig.n_samples=2",
                   "gconfig.max_new_tokens=8", "valid_dataset.size=4", "evaluator.freq_steps=0",
                   "rollout.max_slots=8", "reward.workers=1")
    train(cfg)
    records = read_metrics(tmp_path / "asyncrl" / "default")
    steps = [r for r in records if r["step"] > 0]
    assert len(steps) == 3 and steps[-1]["reward_errors"] == 0
    for r in steps:  # each source scored by its own function, in a reward worker process
        assert r["samples/ones"] + r["samples/zeros"] == r["n_samples"] == 8
        assert r.get("reward_mean/ones", 1.0) == 1.0 and r.get("reward_mean/zeros", 0.0) == 0.0
        assert r["reward_mean"] == r["samples/ones"] / 8
    for name in ("ones", "zeros"):
        assert any(f"reward_mean/{name}" in r for r in steps)
        assert f"eval_accuracy/{name}" in records[0] and f"eval_accuracy/{name}" in steps[-1]
    assert steps[-1]["eval_accuracy/ones"] == 1.0 and steps[-1]["eval_accuracy/zeros"] == 0.0


# ---- held-out rows are never trained on -----------------------------------------------------------------
def test_a_one_row_file_is_refused(tmp_path):
    one = write_jsonl(tmp_path / "one.jsonl", ROWS[:1])
    with pytest.raises(ConfigError, match=r"train_dataset.path: '.*one\.jsonl' has a single usable row, and "
                                          r"held-out rows are never trained on: give valid_dataset.path"):
        build(one)
    with pytest.raises(ConfigError, match="single usable row"):
        eval_set_from_config(TaskConfig(), ValidDatasetConfig(), TrainDatasetConfig(path=one))
    two = write_jsonl(tmp_path / "two.jsonl", ROWS[:2])
    data = build(two)
    assert not {it["question"] for it in data.valid} & {it["question"] for it in itertools.islice(data.train, 9)}
    valid = write_jsonl(tmp_path / "valid.jsonl", ROWS[5:7])
    assert len(build(one, valid).valid) == 2  # a separate held-out file makes one training row fine


def test_held_out_file_overlapping_the_training_file_is_warned_about(tmp_path, caplog):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    valid = write_jsonl(tmp_path / "valid.jsonl", ROWS[:3] + [{"question": "new", "answer": "1"}])
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        build(train, valid)
    assert "3 of the 4 held-out questions" in caplog.text and "trains on them" in caplog.text


# ---- the plain-argument API -----------------------------------------------------------------------------
def test_data_functions_take_plain_arguments(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    data = file_dataset(path, row_type="qa", fields={"question": "question"}, template="Q: {question}",
                        valid_size=2, valid_seed=1, seed=3)
    assert len(data.valid) == 2 and next(data.train)["question"].startswith("Q: Compute")
    assert data.reward_fn.__name__ == "math_reward" and data.stats()["data_bad_rows"] == 0
    task = task_dataset("arith", {"min_terms": 2, "max_terms": 2, "ops": "*"}, valid_size=4, seed=5)
    assert len(task.valid) == 4 and " * " in next(task.train)["question"]


def test_the_data_package_does_not_import_its_config_module():
    """asyncrl.data.config imports asyncrl.data; the reverse at module level would be circular."""
    import ast

    import asyncrl.data

    tree = ast.parse(Path(asyncrl.data.__file__).read_text())
    imported = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert "asyncrl.data.config" not in imported


def test_held_out_rows_are_never_trained_on(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(50)])
    data = build(path, valid_size=100)
    held = {it["question"] for it in data.valid}
    assert len(held) == 5  # at most a tenth of the file
    seen = take(data.train, 200)  # four epochs
    assert not held & {it["question"] for it in seen}
    assert len({it["id"] for it in seen}) == 200 and data.stats()["data_epoch"] == 4
    train, valid = hold_out(list(range(10)), 3, seed=1)
    assert len(valid) == 1 and not set(train) & set(valid)
    # a question written twice in the file: held out, its copy is not trained on either
    path = write_jsonl(tmp_path / "twice.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(100)] * 2)
    data = build(path, valid_size=20)
    assert not {it["question"] for it in data.valid} & {it["question"] for it in take(data.train, 400)}
    # a chat prompt twice with two reference replies: one prompt (the replies are not part of what it asks)
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": reply}]}
            for reply in ("first", "second") for i in range(20)]
    data = build(write_jsonl(tmp_path / "replies.jsonl", rows), valid_size=4)
    held = {it["messages"][0]["content"] for it in data.valid}
    assert held and not held & {it["messages"][0]["content"] for it in take(data.train, 80)}


def test_a_row_the_chat_template_rejects_costs_that_row_only(tmp_path, caplog):
    """A template that needs alternating roles (Mistral's, Llama 2's) rejects one row of fifty: counted and said
    with its file and line, the others load (the whole load ended in a bare jinja error); with
    skip_bad_rows=false it stops there, as for any bad row."""
    from asyncrl.models.hf import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("builtin:tiny-sft"))  # its own copy: the template changes
    tokenizer.chat_template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                               "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
                               "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")
    rows = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "yo"}]}
            for i in range(50)]
    rows[17]["messages"].insert(0, {"role": "user", "content": "twice"})
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    data = file_dataset(path, tokenizer=tokenizer, max_prompt_tokens=100, valid_size=5)
    assert data.stats()["data_bad_rows"] == 1 and len(take(data.train, 44)) == 44
    assert "chat.jsonl:18: the chat template rejects the row (TemplateError: Conversation roles must" in caplog.text
    with pytest.raises(ConfigError, match=r"chat.jsonl:18: the chat template rejects .*skip_bad_rows=true skips"):
        file_dataset(path, tokenizer=tokenizer, max_prompt_tokens=100, valid_size=5, skip_bad_rows=False)


def test_a_file_with_many_over_long_prompts_in_a_row_is_read_to_its_end(tmp_path, tokenizer, monkeypatch):
    """The guard against an endless stream of over-long prompts does not refuse a file that has usable rows."""
    import asyncrl.data as data_module

    monkeypatch.setattr(data_module, "MAX_SKIPS_IN_A_ROW", 10)
    short = [{"question": f"Compute {i} + 1.", "answer": "1"} for i in range(30)]
    long = [{"question": "Compute " + " + ".join(["1"] * 30) + f" + {i}.", "answer": "1"} for i in range(40)]
    data = file_dataset(write_jsonl(tmp_path / "sorted.jsonl", short + long), tokenizer=tokenizer,
                        max_prompt_tokens=40, valid_size=3, shuffle=False)
    assert data.stats()["data_skipped_long"] >= 36 and len({it["question"] for it in take(data.train, 27)}) == 27


def test_one_file_in_two_mixture_entries_never_trains_a_held_out_prompt(tmp_path):
    """Each entry holds out its own rows; the other entry read the same file and trained on them (20 leaked)."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(300)])
    cfg = configlib.load(TrainConfig, None, [
        f"train_dataset.mixture={json.dumps([{'name': 'a', 'path': path}, {'name': 'b', 'path': path, 'weight': 3}])}",
        "valid_dataset.size=40"])
    data = dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)
    held = [it["question"] for it in data.valid]
    assert len(held) == len(set(held)) and not set(held) & {it["question"] for it in take(data.train, 3000)}
    # the same file under two templates: a problem held out under one wording is not trained under the other
    entries = [{"name": "plain", "path": path, "weight": 3},
               {"name": "cot", "path": path, "prompt_template": "Think step by step. {question}"}]
    cfg = configlib.load(TrainConfig, None, [f"train_dataset.mixture={json.dumps(entries)}", "valid_dataset.size=40"])
    data = dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)
    held = {it["question"].removeprefix("Think step by step. ") for it in data.valid}
    trained = {it["question"].removeprefix("Think step by step. ") for it in take(data.train, 3000)}
    assert held and not held & trained
    assert "question_before_template" not in item_fields(data.valid[-1])  # not passed to reward functions
    chat = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": f"q{i}"},
                                                            {"role": "assistant", "content": str(i)}]}
                                              for i in range(300)])  # the same with chat rows
    entries = [{"name": "plain", "path": chat, "weight": 3},
               {"name": "cot", "path": chat, "prompt_template": "Think step by step. {question}"}]
    cfg = configlib.load(TrainConfig, None, [f"train_dataset.mixture={json.dumps(entries)}", "valid_dataset.size=40"])
    data = dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)

    def asked(item):
        return item["messages"][0]["content"].removeprefix("Think step by step. ")

    held = {asked(it) for it in data.valid}
    assert held and not held & {asked(it) for it in take(data.train, 3000)}


def test_a_context_column_left_out_of_the_prompt_is_said_once(tmp_path, caplog):
    """Dolly's rows (instruction, context, response): without a template the model is asked to summarise a text
    it never sees; said once, naming the column and the template that puts it in."""
    rows = [{"instruction": f"Summarize this. {i}", "context": "A long paragraph.", "response": "Short."}
            for i in range(20)]
    path = write_jsonl(tmp_path / "dolly.jsonl", rows)
    file_dataset(path, valid_size=2)
    said = [r.getMessage() for r in caplog.records if "is not part of the prompt" in r.getMessage()]
    assert len(said) == 1 and "dolly.jsonl:1: the column 'context'" in said[0]
    assert "{question}\\n\\n{context}" in said[0]
    caplog.clear()
    data = file_dataset(path, valid_size=2, template="{question}\n\n{context}")
    assert not [r for r in caplog.records if "is not part of the prompt" in r.getMessage()]
    assert data.valid[0]["question"].endswith("A long paragraph.")
