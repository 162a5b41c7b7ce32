"""Data mistakes that used to give wrong labels, hang, crash an evaluation or drop rows silently: task options
checked up front, a prompt limit that defaults to the model's room and covers held-out rows, a one-row file
refused, byte-order marks and odd line breaks read, prompt templates and field mappings checked."""

import itertools
import json
import logging
import re
from pathlib import Path

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data import file_dataset, task_dataset
from asyncrl.data.arith import ArithTask
from asyncrl.data.config import (LookupOptions, TaskConfig, TrainDatasetConfig, ValidDatasetConfig,
                                 eval_set_from_config, prompt_limit)
from datasets_for_tests import ROWS, build, questions, write_jsonl


# ---- task options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("options,match", [
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
    (dict(name="lookup", min_terms=2, direct_frac=0.5, lookup=LookupOptions(["apples", "pears"])),
     r"task.lookup.direct_things names no thing of the lookup task: \['pears'\]"),
    (dict(name="algebra"), r"no built-in task 'algebra': task.name .* one of \['arith', 'lookup'\]"),
])
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


def test_every_allowed_operator_gives_right_labels():
    task = ArithTask(min_terms=2, max_terms=6, ops="+-*")
    for item in itertools.islice(task.stream(3), 300):
        expression = item["question"].removeprefix("Compute ").removesuffix(".")
        value = int(expression.split()[0])
        for op, operand in re.findall(r"([-+*]) (\d+)", expression):  # left to right, as the steps are written
            value = {"+": value + int(operand), "-": value - int(operand), "*": value * int(operand)}[op]
        assert str(value) == item["answer"], item


def test_too_few_distinct_problems_is_an_error_not_a_hang():
    tiny = TaskConfig(min_terms=2, max_terms=2, max_operand=2, ops="+")  # 2 + 1 and 2 + 2 only
    with pytest.raises(ConfigError, match=r"valid_dataset.size=200: task 'arith': its options allow only about 2 "
                                          "distinct problems, fewer than 200"):
        build(task=tiny, valid_size=200)
    with pytest.raises(ConfigError, match="problems in a row were held-out ones"):
        build(task=tiny, valid_size=2)  # both held out: nothing left to train on
    assert len(build(task=tiny, valid_size=1).valid) == 1


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
    return (write_jsonl(tmp_path / "train.jsonl", ROWS),
            write_jsonl(tmp_path / "valid.jsonl", ROWS[:3] + [{"question": long_q, "answer": "1"}] + ROWS[3:6]))


def test_default_limit_skips_an_over_long_held_out_row(tmp_path, tokenizer):
    train, valid = _long_row_file(tmp_path)
    data = build(train, valid, valid_size=10, tokenizer=tokenizer, default_max_prompt_tokens=200)
    assert len(data.valid) == 6 and max(len(it["prompt_ids"]) for it in data.valid) <= 200
    assert data.stats()["data_skipped_long"] == 1
    unlimited = build(train, valid, valid_size=10, tokenizer=tokenizer, default_max_prompt_tokens=200,
                      max_prompt_tokens=0)
    assert len(unlimited.valid) == 7 and unlimited.stats()["data_skipped_long"] == 0


def test_default_limit_applies_to_a_held_out_split_of_the_training_file(tmp_path, tokenizer):
    long_rows = [{"question": "word " * 4_000, "answer": "1"}] * 3
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS + long_rows)
    data = build(path, valid_size=100, tokenizer=tokenizer, default_max_prompt_tokens=200)
    assert data.stats()["data_skipped_long"] == 3  # wherever they fell, train or held out
    assert all(len(it["prompt_ids"]) <= 200 for it in data.valid)


def test_eval_set_applies_the_limit(tmp_path, tokenizer):
    _, valid = _long_row_file(tmp_path)
    items, _ = eval_set_from_config(TaskConfig(), ValidDatasetConfig(path=valid, size=10), tokenizer=tokenizer,
                                    default_max_prompt_tokens=200)
    assert len(items) == 6
    with pytest.raises(ConfigError, match="valid_dataset.path: every row is longer than 5 tokens"):
        eval_set_from_config(TaskConfig(), ValidDatasetConfig(path=valid, size=10), tokenizer=tokenizer,
                             default_max_prompt_tokens=5)


def test_a_limit_nothing_fits_under_is_a_config_error_at_build_time(tokenizer):
    with pytest.raises(ConfigError, match="held-out split is empty"):
        build(tokenizer=tokenizer, max_prompt_tokens=3)
    data = task_dataset("arith", {}, valid_size=3, tokenizer=tokenizer, max_prompt_tokens=10_000)
    assert len(data.valid) == 3 and "prompt_ids" in next(data.train)


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


# ---- reading files --------------------------------------------------------------------------------------
def test_byte_order_mark_keeps_the_first_row(tmp_path):
    body = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + body)
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(ROWS, indent=1).encode())
    for name in ("bom.jsonl", "bom.json"):
        data = build(str(tmp_path / name))
        assert questions(data) == {r["question"] for r in ROWS} and data.stats()["data_bad_rows"] == 0


def test_unicode_line_separators_inside_strings_stay_in_their_row(tmp_path):
    rows = [{"question": f"Line one\u2028line two\x85{i}", "answer": str(i)} for i in range(20)]
    data = build(write_jsonl(tmp_path / "u.jsonl", rows, ensure_ascii=False))
    assert questions(data) == {r["question"] for r in rows} and data.stats()["data_bad_rows"] == 0


def test_a_non_utf8_line_costs_that_row_only(tmp_path, caplog):
    lines = [json.dumps(r).encode() for r in ROWS]
    lines[4] = b'{"question": "caf\xe9", "answer": "1"}'
    (tmp_path / "latin1.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        data = build(str(tmp_path / "latin1.jsonl"))
    assert len(questions(data)) == 19 and data.stats()["data_bad_rows"] == 1
    assert "latin1.jsonl:5: not UTF-8 text" in caplog.text
    (tmp_path / "latin1.json").write_bytes(b'[\n{"question": "caf\xe9", "answer": "1"}\n]')
    with pytest.raises(ConfigError, match=r"latin1\.json:2: not UTF-8 text"):
        build(str(tmp_path / "latin1.json"))


def test_unreadable_data_file_is_a_config_error(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ConfigError, match=r"train_dataset.path: cannot read '.*rows\.jsonl' \(Permission denied\)"):
        build(path)


# ---- prompt templates and field mappings ----------------------------------------------------------------
@pytest.mark.parametrize("template,match", [
    ("{question} Put it in \\boxed{}.", r"'\{\}' is a positional field: .* write \{\{\}\} for literal braces"),
    ("{0}: {question}", r"'\{0\}' is a positional field"),
    ("Solve it.", r"it names no field such as \{question\}, so every prompt would be the same text"),
    ("{question", "not a valid format string"),
    ("{question!x}", r"'\{question!x\}': the conversion must be !r, !s or !a"),
])
def test_bad_prompt_templates_are_refused_up_front(template, match):
    with pytest.raises(ConfigError, match=r"^train_dataset.prompt_template: " + match):
        TrainDatasetConfig(prompt_template=template).validate()
    with pytest.raises(ConfigError, match="train_dataset.prompt_template"):
        configlib.load(TrainConfig, None, [f"train_dataset.prompt_template='{template}'"])


def test_template_that_fails_on_every_item_is_a_config_error_not_a_traceback(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(ConfigError, match=r"(?s)no usable rows.*cannot be formatted \(AttributeError"):
        build(path, prompt_template="{question.nope}")
    with pytest.raises(ConfigError, match=r"(?s)no usable rows.*cannot be formatted \(TypeError"):
        build(path, prompt_template="{question} {answer[x]}")
    with pytest.raises(ConfigError, match=r"prompt_template cannot be formatted \(AttributeError.*task 'arith'"):
        build(prompt_template="{question.nope}")
    assert build(prompt_template="{question} ({answer!r:.0})").valid  # a valid conversion and spec work


@pytest.mark.parametrize("column", [["q"], 3, ""])
def test_field_mapping_to_a_non_column_is_refused(column):
    with pytest.raises(ConfigError, match="train_dataset.fields.question must be a column name"):
        TrainDatasetConfig(fields={"question": column}).validate()


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
