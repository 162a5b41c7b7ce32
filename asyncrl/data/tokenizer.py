"""Build a small byte-level BPE tokenizer offline, saved in Hugging Face format with a chat template.

Digits are always single tokens (as in Qwen and Llama 3), so arithmetic is written digit by digit. The
byte-level alphabet means any text encodes and decodes exactly, even characters never seen in training.
The text it is trained on is a built-in task's (``asyncrl.models.hf.tokenizer_corpus``) or a user's file
(:func:`read_corpus`, ``asyncrl init-model --corpus FILE``), plus the chat template's own words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from asyncrl.configlib import ConfigError
from asyncrl.data.chat import TemplateError, content_text


def _turn_text(message: dict) -> str:
    """An OpenAI turn's text (content parts too); "" for content that is neither (a ShareGPT turn's is ``value``)."""
    try:
        return content_text(message.get("content"))
    except TemplateError:
        return ""


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE_WORDS = ["user", "assistant", "system", "You are a helpful assistant."]
"""The text the chat template writes around messages besides its special tokens (the role names), and the
usual system prompt: trained on so that a rendered chat costs a token per role, not one per byte."""
SKIPPED_FIELDS = ("id",)
"""Columns of a JSON row that are not text to learn (read when named with ``fields``)."""
CORPUS_SUFFIXES = (".txt", ".jsonl", ".json", ".ndjson")


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024):
    """Train a byte-level BPE on ``corpus`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def with_template_words(documents: list[str]) -> list[str]:
    """``documents`` and the chat template's words, each on a line of its own (the template writes a role
    name right after ``<|im_start|>``, with no space before it) and as often as there are documents (each
    document becomes one chat, so the role names are about as frequent as that): BPE merges them whatever the
    corpus size."""
    return list(documents) + list(TEMPLATE_WORDS) * max(1, len(documents))


def read_corpus(path: str, key: str = "--corpus", fields: list[str] | None = None) -> list[str]:
    """The documents of a corpus file: a ``.txt`` file (one document per line, blank lines skipped) or a
    ``.jsonl`` / ``.json`` file of rows whose text is every string field (a list of strings too) and the
    contents of chat ``messages`` (:func:`row_texts`), or only the columns ``fields``. A ConfigError in one line
    names ``key`` and the file (and line) that is wrong."""
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise ConfigError(
            f"{key}: '{path}' {what}; give a .txt file (one document per line) or a .jsonl / .json file of rows"
        )
    if file.suffix not in CORPUS_SUFFIXES:
        raise ConfigError(
            f"{key}: cannot read '{path}': expected a .txt file (one document per line) or a "
            ".jsonl / .json file of rows"
        )
    if fields and file.suffix == ".txt":
        raise ConfigError(f"--fields picks columns of .jsonl / .json rows; '{path}' is a text file")
    documents = _text_lines(file, key) if file.suffix == ".txt" else _row_texts(file, key, fields)
    if not documents:
        raise ConfigError(f"{key}: '{path}' holds no text")
    return documents


def _text_lines(file: Path, key: str) -> list[str]:
    try:
        raw = file.read_bytes()
    except OSError as e:
        raise ConfigError(f"{key}: cannot read '{file}' ({e.strerror or e})") from None
    documents = []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        try:
            text = line.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{key}: {file}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start} of the line)"
            ) from None
        if text:
            documents.append(text)
    return documents


def _row_texts(file: Path, key: str, fields: list[str] | None) -> list[str]:
    from asyncrl.data.sources import RowError, read_rows

    documents, seen = [], set()
    for row in read_rows(file, "train", key):
        if isinstance(row, RowError):
            raise ConfigError(f"{key}: {row}")
        if fields and isinstance(row.data, dict):
            seen |= set(fields) & set(row.data)
        try:
            texts = row_texts(row.data, fields)
        except ValueError as e:
            raise ConfigError(f"{key}: {row.where}: {e}") from None
        documents += [t for t in texts if t.strip()]
    missing = sorted(set(fields or ()) - seen)
    if missing:
        raise ConfigError(f"--fields: no row of '{file}' has the column(s) {missing}")
    return documents


def row_texts(data, fields: list[str] | None = None) -> list[str]:
    """The text of one corpus row: a string, or an object's string fields (each string of a list field too;
    not :data:`SKIPPED_FIELDS`) and its chat ``messages`` contents, or only its columns ``fields`` (a row
    without them gives none); ValueError for a row that has no text at all."""
    if isinstance(data, str):
        return [data]
    if not isinstance(data, dict):
        raise ValueError(f"a row must be a JSON object or a string, got {type(data).__name__}")
    names = list(fields) if fields else [k for k in data if k not in SKIPPED_FIELDS]
    texts = []
    for name in names:
        value = data.get(name)
        if name in ("messages", "conversations", "conversation") and isinstance(value, str):
            try:  # a conversation stored as JSON text: its turns, not the JSON
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if name in ("messages", "conversations", "conversation") and isinstance(value, list):
            if not all(isinstance(m, dict) for m in value):
                raise ValueError(f"'{name}' must be a list of {{role, content}} objects")
            texts += [t for m in value for t in (_turn_text(m), m.get("value")) if isinstance(t, str) and t]
        elif isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
            texts += [v for v in value if isinstance(v, str)]
    if not texts and not fields:
        raise ValueError(f"no text: no string field and no chat 'messages' (fields: {sorted(data)[:10]})")
    return texts
