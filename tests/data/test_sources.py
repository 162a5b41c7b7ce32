"""Reading rows (asyncrl.data.sources): JSONL, JSON arrays, Parquet, saved datasets and cached hub datasets; byte-order
marks, odd line breaks and non-UTF-8 lines; malformed rows named by file and line, or skipped and counted; unreadable
files."""

import json
import logging
from pathlib import Path

import pytest

from asyncrl.configlib import ConfigError
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig, dataset_from_config

from datasets_for_tests import ROWS, build, questions, take, write_jsonl

BAD_ROWS = [
    {"question": "good one", "answer": "#### 1"},
    '{"question": "broken", "answer": ',
    "[1, 2, 3]",
    {"text": "no question field", "answer": "#### 2"},
    "",
    {"question": "gsm8k without the final line", "answer": "it is 3"},
    {"question": "good two", "answer": "step\n#### 4"},
]


def test_malformed_rows_are_errors_naming_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: not valid JSON"):
        build(path, path, type="gsm8k", skip_bad_rows=False)
    good_prefix = write_jsonl(tmp_path / "bad2.jsonl", [BAD_ROWS[0], BAD_ROWS[3]])
    with pytest.raises(ConfigError, match=r"bad2\.jsonl:2: no question text"):
        build(good_prefix, good_prefix, type="gsm8k", skip_bad_rows=False)


def test_malformed_rows_are_skipped_counted_and_logged(tmp_path, caplog):
    path = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        data = build(path, path)
    assert sorted(it["question"] for it in data.valid) == ["good one", "good two"][: len(data.valid)]
    assert data.stats()["data_bad_rows"] == 2 * 4  # four bad rows, read once for train and once for valid
    logged = " ".join(r.getMessage() for r in caplog.records)
    for line in (2, 3, 4, 6):
        assert f"bad.jsonl:{line}:" in logged
    assert "must be a JSON object" in logged and "#### <final answer>" in logged


def test_a_file_with_no_good_rows_is_a_config_error(tmp_path):
    path = write_jsonl(tmp_path / "all_bad.jsonl", ["{", "nope"])
    with pytest.raises(ConfigError, match=r"(?s)no usable rows.*all_bad\.jsonl:1: not valid JSON"):
        build(path)


def test_json_array_file(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"problem": "Compute $1+1$.", "solution": "$\\boxed{2}$"}] * 3))
    data = build(str(path), str(path))
    assert data.valid[0]["answer"] == "2"


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"question": [f"Compute {i} * 2." for i in range(20)], "answer": [str(2 * i) for i in range(20)]})
    pq.write_table(table, tmp_path / "train.parquet")
    data = build(str(tmp_path / "train.parquet"))
    assert len(data.valid) == 2 and take(data.train, 1)[0]["question"].startswith("Compute")
    bad = pa.table({"question": ["ok", ""], "answer": ["1", "2"]})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match=r"bad\.parquet row 2: no question text"):
        build(str(tmp_path / "bad.parquet"), skip_bad_rows=False)


def test_saved_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {
        "problem": [f"What is ${i}^2$?" for i in range(12)],
        "solution": [f"$\\boxed{{{i * i}}}$" for i in range(12)],
    }
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows),
            "test": datasets.Dataset.from_dict({k: v[:3] for k, v in rows.items()}),
        }
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    data = build(str(tmp_path / "saved"), str(tmp_path / "saved"))
    assert [it["answer"] for it in data.valid] == ["0", "1", "4"]
    with pytest.raises(ConfigError, match="valid_dataset.split: .* has no split 'validation'"):
        dataset_from_config(
            TaskConfig(),
            TrainDatasetConfig(path=str(tmp_path / "saved")),
            ValidDatasetConfig(path=str(tmp_path / "saved"), split="validation"),
        )


def fake_hub_dataset(cache: Path, name: str, files: dict[str, list[dict]]) -> None:
    """A dataset as huggingface_hub caches it: refs/main names a snapshot folder holding the repository's files."""
    repo = cache / f"datasets--{name.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    for rel, rows in files.items():
        (repo / "snapshots" / "0123abcd" / rel).parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(repo / "snapshots" / "0123abcd" / rel, rows)


def test_a_hub_dataset_in_the_local_cache_is_read_by_name(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(9)]
    fake_hub_dataset(
        tmp_path / "hub",
        "acme/sums",
        {"data/train-00000-of-00001.jsonl": rows[:6], "data/test-00000-of-00001.jsonl": rows[6:]},
    )
    data = build("acme/sums", "acme/sums")
    assert {it["question"] for it in take(data.train, 30)} == {f"q{i}" for i in range(6)}
    assert [it["question"] for it in data.valid] == ["q6", "q7", "q8"]
    fake_hub_dataset(tmp_path / "hub", "acme/two", {"main/train.jsonl": rows, "other/train.jsonl": rows})
    with pytest.raises(ConfigError, match=r"several configurations \(main, other\): name one, add /main"):
        build("acme/two")
    assert questions(build("acme/two/other")) == {f"q{i}" for i in range(9)}  # 5 held out of the 9
    with pytest.raises(ConfigError, match="has no file of split 'validation'"):
        dataset_from_config(
            TaskConfig(), TrainDatasetConfig(path="acme/sums"), ValidDatasetConfig(path="acme/sums", split="validation")
        )
    fake_hub_dataset(
        tmp_path / "hub",
        "acme/chat",
        {"data/train_sft-00000-of-00001.jsonl": rows[:6], "data/train_gen-00000-of-00001.jsonl": rows[6:]},
    )
    with pytest.raises(ConfigError, match="has no file of split 'train' .*train_gen.*train_sft"):
        build("acme/chat")  # ultrachat_200k's splits: train_sft and train_gen are not train (both were read)
    assert questions(
        dataset_from_config(
            TaskConfig(), TrainDatasetConfig(path="acme/chat", split="train_sft"), ValidDatasetConfig(size=2)
        )
    ) <= {f"q{i}" for i in range(6)}
    with pytest.raises(
        ConfigError,
        match="'acme/absent' does not exist .*hub dataset already in the local "
        "Hugging Face cache.*nothing is downloaded",
    ):
        build("acme/absent")


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


def test_a_row_nested_too_deep_costs_that_row_only(tmp_path, caplog):
    lines = [json.dumps(r).encode() for r in ROWS]
    lines[2] = b'{"question": ' + b"[" * 5000 + b"]" * 5000 + b', "answer": "1"}'  # was a RecursionError
    (tmp_path / "deep.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        data = build(str(tmp_path / "deep.jsonl"))
    assert len(questions(data)) == 19 and data.stats()["data_bad_rows"] == 1
    assert "deep.jsonl:3: nested deeper than a JSON row may be" in caplog.text
    (tmp_path / "deep.json").write_bytes(b"[" * 5000 + b"]" * 5000)
    with pytest.raises(ConfigError, match=r"deep\.json: nested deeper than a JSON file may be"):
        build(str(tmp_path / "deep.json"))


def test_unreadable_data_file_is_a_config_error(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ConfigError, match=r"train_dataset.path: cannot read '.*rows\.jsonl' \(Permission denied\)"):
        build(path)


def test_a_damaged_page_in_a_parquet_file_is_an_error_naming_the_file(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    from asyncrl.data.datasets import file_dataset

    path = tmp_path / "damaged.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"question": f"q{i}" + " pad" * 20, "answer": "1"} for i in range(2000)]),
        path,
        row_group_size=500,
    )
    raw = bytearray(path.read_bytes())
    start = pq.ParquetFile(path).metadata.row_group(2).column(0).data_page_offset
    for i in range(start + 40, start + 400):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="damaged.parquet' cannot be read after row"):
        file_dataset(str(path))
