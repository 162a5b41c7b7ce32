"""Rows to items (asyncrl.data.rows): a row the chat template rejects costs that row only, a file of many over-long
prompts in a row is read to its end, and a context column left out of the prompt is said once."""

import pytest

from asyncrl.configlib import ConfigError
from asyncrl.data.datasets import file_dataset

from datasets_for_tests import take, write_jsonl


def test_a_row_the_chat_template_rejects_costs_that_row_only(tmp_path, caplog):
    """A template that needs alternating roles (Mistral's, Llama 2's) rejects one row of fifty: counted and said
    with its file and line, the others load (the whole load ended in a bare jinja error); with
    skip_bad_rows=false it stops there, as for any bad row."""
    from asyncrl.models.hf import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("builtin:tiny-sft"))  # its own copy: the template changes
    tokenizer.chat_template = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    )
    rows = [
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "yo"}]}
        for i in range(50)
    ]
    rows[17]["messages"].insert(0, {"role": "user", "content": "twice"})
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    data = file_dataset(path, tokenizer=tokenizer, max_prompt_tokens=100, valid_size=5)
    assert data.stats()["data_bad_rows"] == 1 and len(take(data.train, 44)) == 44
    assert "chat.jsonl:18: the chat template rejects the row (TemplateError: Conversation roles must" in caplog.text
    with pytest.raises(ConfigError, match=r"chat.jsonl:18: the chat template rejects .*skip_bad_rows=true skips"):
        file_dataset(path, tokenizer=tokenizer, max_prompt_tokens=100, valid_size=5, skip_bad_rows=False)


def test_a_file_with_many_over_long_prompts_in_a_row_is_read_to_its_end(tmp_path, tokenizer, monkeypatch):
    """The guard against an endless stream of over-long prompts does not refuse a file that has usable rows."""
    import asyncrl.data.rows as rows

    monkeypatch.setattr(rows, "MAX_SKIPS_IN_A_ROW", 10)
    short = [{"question": f"Compute {i} + 1.", "answer": "1"} for i in range(30)]
    long = [{"question": "Compute " + " + ".join(["1"] * 30) + f" + {i}.", "answer": "1"} for i in range(40)]
    data = file_dataset(
        write_jsonl(tmp_path / "sorted.jsonl", short + long),
        tokenizer=tokenizer,
        max_prompt_tokens=40,
        valid_size=3,
        shuffle=False,
    )
    assert data.stats()["data_skipped_long"] >= 36 and len({it["question"] for it in take(data.train, 27)}) == 27


def test_a_context_column_left_out_of_the_prompt_is_said_once(tmp_path, caplog):
    """Dolly's rows (instruction, context, response): without a template the model is asked to summarise a text
    it never sees; said once, naming the column and the template that puts it in."""
    rows = [
        {"instruction": f"Summarize this. {i}", "context": "A long paragraph.", "response": "Short."} for i in range(20)
    ]
    path = write_jsonl(tmp_path / "dolly.jsonl", rows)
    file_dataset(path, valid_size=2)
    said = [r.getMessage() for r in caplog.records if "is not part of the prompt" in r.getMessage()]
    assert len(said) == 1 and "dolly.jsonl:1: the column 'context'" in said[0]
    assert "{question}\\n\\n{context}" in said[0]
    caplog.clear()
    data = file_dataset(path, valid_size=2, template="{question}\n\n{context}")
    assert not [r for r in caplog.records if "is not part of the prompt" in r.getMessage()]
    assert data.valid[0]["question"].endswith("A long paragraph.")
