"""The dataset sections and what builds datasets from them (asyncrl.data.config): task options checked up front, a
prompt limit that defaults to the model's room and covers held-out rows, field mappings, mixture entries, built-in
paths, and evaluation sets without a training source."""

import copy
import json

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.arith import arith_reward
from asyncrl.data.config import (
    LookupOptions,
    TaskConfig,
    TrainDatasetConfig,
    ValidDatasetConfig,
    dataset_from_config,
    eval_set_from_config,
    prompt_limit,
)
from asyncrl.data.datasets import task_dataset
from asyncrl.reward import call_reward

from datasets_for_tests import ROWS, SAMPLES, build, take, write_jsonl


# ---- task options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options,match",
    [
        (dict(ops="/"), r"task.ops must be made of the operators \+ - \* \(e.g. '\+-'\), got '/'"),
        (dict(ops=""), "task.ops must be made of the operators"),
        (dict(ops="+ -"), "task.ops must be made of the operators"),
        (dict(min_terms=6, max_terms=3), r"task.max_terms \(3\) must be >= min_terms \(6\)"),
        (dict(min_terms=1, max_terms=1), "task.min_terms must be >= 2"),
        (dict(max_operand=1), "task.max_operand must be >= 2, got 1"),
        (dict(direct_frac=1.5), r"task.direct_frac must be in \[0, 1\], got 1.5"),
        (dict(direct_frac=-0.1), r"task.direct_frac must be in \[0, 1\]"),
        (dict(lookup=LookupOptions(["apples"])), r"task.lookup.\* are options of the lookup task"),
        (dict(name="lookup", min_terms=2, lookup=LookupOptions(["apples"])), r"set task.direct_frac > 0"),
        (
            dict(name="lookup", min_terms=2, direct_frac=0.5, lookup=LookupOptions(["apples", "pears"])),
            r"task.lookup.direct_things names no thing of the lookup task: \['pears'\]",
        ),
        (dict(name="algebra"), r"no built-in task 'algebra': task.name .* one of \['arith', 'lookup'\]"),
    ],
)
def test_bad_task_options_are_refused_up_front(options, match):
    with pytest.raises(ConfigError, match=match):
        TaskConfig(**options).validate()
    with pytest.raises(ConfigError, match=match):
        build(task=TaskConfig(**options))


def test_train_config_validates_the_task():
    with pytest.raises(ConfigError, match="task.ops must be made of the operators"):
        configlib.load(TrainConfig, None, ["task.ops=/"])
    with pytest.raises(ConfigError, match="task.max_terms"):
        configlib.load(TrainConfig, None, ["task.min_terms=6", "task.max_terms=3"])


# ---- prompt length limit --------------------------------------------------------------------------------
def test_prompt_limit_resolution():
    assert prompt_limit(None, 448) == 448  # default: the model's context minus gconfig.max_new_tokens
    assert prompt_limit(0, 448) is None  # 0 = no limit
    assert prompt_limit(100, 448) == 100 and prompt_limit(None, None) is None
    with pytest.raises(ConfigError, match=r"leaves no room for a prompt; lower max_new_tokens \(gconfig"):
        prompt_limit(None, 0)
    assert TrainDatasetConfig().max_prompt_tokens is None
    with pytest.raises(ConfigError, match=r"train_dataset.max_prompt_tokens must be >= 0 \(0 = no limit\)"):
        TrainDatasetConfig(max_prompt_tokens=-1).validate()
    cfg = configlib.load(TrainConfig, None, ["train_dataset.max_prompt_tokens=null"])
    assert cfg.train_dataset.max_prompt_tokens is None


def _long_row_file(tmp_path) -> tuple[str, str]:
    long_q = "word " * 4_000
    return (
        write_jsonl(tmp_path / "train.jsonl", ROWS),
        write_jsonl(tmp_path / "valid.jsonl", ROWS[:3] + [{"question": long_q, "answer": "1"}] + ROWS[3:6]),
    )


def test_default_limit_skips_an_over_long_held_out_row(tmp_path, tokenizer):
    train, valid = _long_row_file(tmp_path)
    data = build(train, valid, valid_size=10, tokenizer=tokenizer, default_max_prompt_tokens=200)
    assert len(data.valid) == 6 and max(len(it["prompt_ids"]) for it in data.valid) <= 200
    assert data.stats()["data_skipped_long"] == 1
    unlimited = build(
        train, valid, valid_size=10, tokenizer=tokenizer, default_max_prompt_tokens=200, max_prompt_tokens=0
    )
    assert len(unlimited.valid) == 7 and unlimited.stats()["data_skipped_long"] == 0


def test_default_limit_applies_to_a_held_out_split_of_the_training_file(tmp_path, tokenizer):
    long_rows = [{"question": "word " * 4_000, "answer": "1"}] * 3
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS + long_rows)
    data = build(path, valid_size=100, tokenizer=tokenizer, default_max_prompt_tokens=200)
    assert data.stats()["data_skipped_long"] == 3  # wherever they fell, train or held out
    assert all(len(it["prompt_ids"]) <= 200 for it in data.valid)


def test_eval_set_applies_the_limit(tmp_path, tokenizer):
    _, valid = _long_row_file(tmp_path)
    items, _, _ = eval_set_from_config(
        TaskConfig(), ValidDatasetConfig(path=valid, size=10), tokenizer=tokenizer, default_max_prompt_tokens=200
    )
    assert len(items) == 6
    with pytest.raises(
        ConfigError,
        match=r"valid_dataset.path: no usable row among the first 10: \d+ longer than 5 "
        r"tokens .*, 0 malformed or refused by the chat template",
    ):
        eval_set_from_config(
            TaskConfig(), ValidDatasetConfig(path=valid, size=10), tokenizer=tokenizer, default_max_prompt_tokens=5
        )
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None  # every row refused by the (missing) template: said so, not "longer than"
    with pytest.raises(ConfigError, match=r"first 10: 0 longer than 200 tokens .*, \d+ malformed or refused"):
        eval_set_from_config(
            TaskConfig(), ValidDatasetConfig(path=valid, size=10), tokenizer=plain, default_max_prompt_tokens=200
        )


def test_a_limit_nothing_fits_under_is_a_config_error_at_build_time(tokenizer):
    with pytest.raises(ConfigError, match="held-out split is empty"):
        build(tokenizer=tokenizer, max_prompt_tokens=3)
    data = task_dataset("arith", {}, valid_size=3, tokenizer=tokenizer, max_prompt_tokens=10_000)
    assert len(data.valid) == 3 and "prompt_ids" in next(data.train)


@pytest.mark.parametrize("column", [["q"], 3, ""])
def test_field_mapping_to_a_non_column_is_refused(column):
    with pytest.raises(ConfigError, match="train_dataset.fields.question must be a column name"):
        TrainDatasetConfig(fields={"question": column}).validate()


def test_builtin_by_path_and_its_errors():
    assert take(build("builtin:arith").train, 3) == take(build().train, 3)
    with pytest.raises(ConfigError, match="no built-in task 'nope'.*task.name"):
        build("builtin:nope")
    with pytest.raises(ConfigError, match="valid_dataset.path"):
        build("", f"{SAMPLES}/gsm8k_test.jsonl")


@pytest.mark.parametrize(
    "override,match",
    [
        (dict(path="/nonexistent/train.jsonl"), "train_dataset.path: '/nonexistent/train.jsonl' does not exist"),
        (dict(path=f"{SAMPLES}/gsm8k_train.jsonl", type="csv"), "train_dataset.type must be one of"),
        (dict(path=f"{SAMPLES}/gsm8k_train.jsonl", fields={"prompt": "x"}), "train_dataset.fields"),
        (dict(path=f"{SAMPLES}/gsm8k_train.jsonl", prompt_template="{nope}"), "prompt_template refers to 'nope'"),
    ],
)
def test_config_errors_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        build(skip_bad_rows=False, **override)


def test_over_long_prompts_are_skipped_and_counted(tmp_path, tokenizer):
    rows = [{"question": "Add 1 and 2.", "answer": "3"}] * 10 + [{"question": "word " * 400, "answer": "1"}] * 10
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    data = build(path, path, valid_size=50, tokenizer=tokenizer, max_prompt_tokens=64)
    assert data.stats()["data_skipped_long"] == 20  # ten in the train list, ten in the valid list
    items = take(data.train, 30)
    assert all(len(it["prompt_ids"]) <= 64 and it["question"] == "Add 1 and 2." for it in items)
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        build(path, tokenizer=tokenizer, max_prompt_tokens=2)


def test_eval_set_from_a_file_needs_no_training_source(tmp_path):
    """``asyncrl eval valid_dataset.path=F``: the file alone, in its detected format, with its own verifier."""
    path = write_jsonl(tmp_path / "test.jsonl", [{"question": f"{i} + 1 = ?", "answer": str(i + 1)} for i in range(8)])
    items, reward_fn, _ = eval_set_from_config(TaskConfig(), ValidDatasetConfig(path=path, size=5))
    assert [it["answer"] for it in items] == ["1", "2", "3", "4", "5"]
    assert reward_fn.__name__ == "math_reward" and call_reward(reward_fn, items[2], "\\boxed{3}") == 1.0
    builtin, arith, _ = eval_set_from_config(TaskConfig(), ValidDatasetConfig(size=5))  # default: the built-in task
    assert len(builtin) == 5 and arith is arith_reward
    with pytest.raises(ConfigError, match="valid_dataset.path"):
        eval_set_from_config(TaskConfig(), ValidDatasetConfig(path=str(tmp_path / "missing.jsonl")))


def _cfg(*overrides) -> TrainConfig:
    return configlib.load(TrainConfig, None, list(overrides))


def _mixture(entries: list[dict], *overrides) -> TrainConfig:
    return _cfg(f"train_dataset.mixture={json.dumps(entries)}", *overrides)


def _data(cfg: TrainConfig):
    return dataset_from_config(cfg.task, cfg.train_dataset, cfg.valid_dataset)


@pytest.mark.parametrize(
    "entry, key",
    [
        ({"path": "builtin:arith", "weight": 0}, "train_dataset.mixture[1].weight"),
        ({"path": "builtin:arith", "weight": "heavy"}, "train_dataset.mixture[1].weight"),
        ({"path": "builtin:arith", "wieght": 2}, "train_dataset.mixture[1].wieght: unknown key; did you mean 'weight'"),
        ({"weight": 2}, "train_dataset.mixture[1].path is required"),
        ({"path": "builtin:arith", "reward_fn": "no_such_module:fn"}, "train_dataset.mixture[1].reward_fn"),
        ({"path": "builtin:arith", "type": "csv"}, "train_dataset.mixture[1].type"),
        ({"path": "builtin:arith", "valid_path": "x.jsonl"}, "train_dataset.mixture[1].valid_path"),
        ({"path": "gym:arith"}, "train_dataset.mixture[1].name: 'arith' is the name of entry 0"),
        ({"path": "builtin:arith", "name": "a/b"}, "train_dataset.mixture[1].name"),
    ],
)
def test_a_bad_entry_is_one_line_naming_its_key(entry, key):
    with pytest.raises(ConfigError) as e:
        _mixture([{"path": "builtin:arith"}, entry])
    assert key in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_mixture_and_path_are_exclusive():
    with pytest.raises(ConfigError, match="train_dataset.path and train_dataset.mixture are exclusive"):
        _mixture([{"path": "builtin:arith"}], "train_dataset.path=builtin:arith")
    with pytest.raises(ConfigError, match=r"train_dataset.mixture\[i\].valid_path"):
        _data(_mixture([{"path": "builtin:arith"}], "valid_dataset.path=held_out.jsonl"))


def test_a_source_that_cannot_load_is_named(tmp_path):
    cfg = _mixture([{"path": "builtin:arith"}, {"name": "gone", "path": str(tmp_path / "missing.jsonl")}])
    with pytest.raises(ConfigError, match=r"mixture\[1\] \(gone\): train_dataset.path: .* does not exist"):
        _data(cfg)
