"""``asyncrl init-model --corpus FILE``: a tokenizer trained on a new domain's text (here: mixing paints), so
its words are a token or two instead of a spelling in bytes, with a chat template that renders compactly."""

import json
import random

import pytest
import torch

from asyncrl.cli import main

COLOURS = ["crimson", "turquoise", "lavender", "ochre", "magenta", "cobalt", "vermilion", "chartreuse"]
WORDS = COLOURS + ["pigment", "paint", "palette", "mixing"]
SHAPE = ["--hidden-size", "64", "--layers", "2"]


def _documents(n: int = 300) -> list[str]:
    rng = random.Random(0)
    docs = []
    for _ in range(n):
        a, b, c = rng.sample(COLOURS, 3)
        docs.append(f"mixing {a} pigment with {b} paint on the palette gives a {c} tint")
    return docs


def _build(capsys, corpus, out, *extra) -> dict:
    assert main(["init-model", "--corpus", str(corpus), "--out", str(out), *SHAPE, *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _tokens_per_word(tokenizer) -> float:
    return sum(len(tokenizer.tokenize(" " + w)) for w in WORDS) / len(WORDS)


def test_corpus_tokenizer_fits_the_domain(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.models.hf import resolve_model_path

    corpus = tmp_path / "paints.txt"
    corpus.write_text("\n".join(_documents()) + "\n\n")  # a blank line is no document
    record = _build(capsys, corpus, tmp_path / "model")
    assert record["documents"] == 300 and record["corpus"] == str(corpus)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    arith = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-sft"))
    assert _tokens_per_word(tokenizer) <= 2 < _tokens_per_word(arith)
    assert _tokens_per_word(tokenizer) < _tokens_per_word(arith) / 2

    messages = [
        {"role": "user", "content": "Mix crimson and cobalt."},
        {"role": "assistant", "content": "A lavender tint."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text.startswith("<|im_start|>user\nMix crimson")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text  # round-trips exactly
    # the template's own text is a token per role: <|im_start|>, user, \n
    assert len(tokenizer("<|im_start|>user\n", add_special_tokens=False).input_ids) == 3
    assert len(tokenizer("<|im_start|>assistant\n", add_special_tokens=False).input_ids) == 3
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.convert_tokens_to_ids("<|im_end|>") in ids

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape[:2] == (1, len(ids)) and logits.shape[-1] >= len(tokenizer)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2


def test_corpus_from_jsonl_rows_and_chats(tmp_path, capsys):
    from transformers import AutoTokenizer

    corpus = tmp_path / "paints.jsonl"
    rows = [{"question": d, "answer": "a tint"} for d in _documents(150)]
    rows += [
        {
            "messages": [
                {"role": "user", "content": "Which paint is turquoise?"},
                {"role": "assistant", "content": "Cobalt with a little ochre."},
            ]
        }
    ] * 20
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = _build(capsys, corpus, tmp_path / "model", "--vocab-size", "400")
    assert record["documents"] == 150 * 2 + 20 * 2 and record["vocab"] <= 400
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert len(tokenizer.tokenize(" turquoise")) <= 2


@pytest.mark.parametrize(
    "name, content, where",
    [
        ("bad.jsonl", b'{"question": "fine"}\n{not json\n', "bad.jsonl:2"),
        ("bad.txt", b"fine\n\xff\xfe broken\n", "bad.txt:2"),
        ("nofield.jsonl", b'{"question": "fine"}\n{"score": 3}\n', "nofield.jsonl:2"),
        ("empty.txt", b"\n\n", "empty.txt"),
        ("table.csv", b"a,b\n", "table.csv"),
        (None, None, "missing.txt"),
    ],
)
def test_bad_corpus_is_one_line(tmp_path, capsys, name, content, where):
    path = tmp_path / (name or "missing.txt")
    if content is not None:
        path.write_bytes(content)
    assert main(["init-model", "--corpus", str(path), "--out", str(tmp_path / "m"), *SHAPE]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--corpus" in err and where in err, err
    assert not (tmp_path / "m").exists()


def test_every_string_column_is_corpus_text_and_fields_picks_some(tmp_path, capsys):
    """A column of any name is text (a user's 'worked' column was left out when only a fixed list was read);
    --fields reads just the named columns and names one that no row has."""
    from asyncrl.data.tokenizer import row_texts

    row = {
        "id": "r1",
        "question": "Count the vowels of 'tobarine'.",
        "worked": "o, a, i, e: four",
        "tags": ["vowels", 3],
        "n": 4,
    }
    assert row_texts(row) == ["Count the vowels of 'tobarine'.", "o, a, i, e: four", "vowels"]
    assert row_texts(row, ["worked"]) == ["o, a, i, e: four"]
    corpus = tmp_path / "rows.jsonl"
    corpus.write_text("".join(json.dumps({"q": d, "worked": d.upper()}) + "\n" for d in _documents(60)))
    assert _build(capsys, corpus, tmp_path / "all")["documents"] == 120
    assert (
        main(["init-model", "--corpus", str(corpus), "--fields", "worked", "--out", str(tmp_path / "w"), *SHAPE]) == 0
    )
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["documents"] == 60
    assert (
        main(["init-model", "--corpus", str(corpus), "--fields", "worked,wroked", "--out", str(tmp_path / "x"), *SHAPE])
        == 2
    )
    err = capsys.readouterr().err
    assert "wroked" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    assert main(["init-model", "--fields", "q", "--out", str(tmp_path / "y"), *SHAPE]) == 2
    assert "--corpus" in capsys.readouterr().err


def test_sharegpt_turns_are_corpus_text(tmp_path):
    from asyncrl.data.tokenizer import read_corpus

    path = tmp_path / "sg.jsonl"
    rows = [
        {
            "source": "sg",
            "conversations": [{"from": "human", "value": "Sort: pear apple"}, {"from": "gpt", "value": "apple pear"}],
        },
        {"conversation": [{"role": "user", "content": "Hi there"}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_corpus(str(path)) == ["sg", "Sort: pear apple", "apple pear", "Hi there"]
