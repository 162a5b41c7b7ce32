"""Turning a raw row into an item: ``question`` (the user turn) plus the fields its reward function takes.

Recognised formats (``train_dataset.type``):

- ``gsm8k``: ``question`` + ``answer`` whose last line is ``#### 42``; the item's ``answer`` is ``42`` and
  its ``solution`` is the worked text (calculator annotations ``<<6*7=42>>`` removed) ending with
  ``The answer is 42.``
- ``math`` (MATH / MATH-500): ``problem`` + ``solution`` with ``\\boxed{}``; ``answer`` is the given answer
  column or the last boxed expression of the solution.
- ``qa``: ``question`` + ``answer`` and/or a ``solution`` (``response``) text; a row without an answer can
  be trained on by SFT, and scored only by a ``reward.fn`` that does not need one.
- ``code`` (APPS / TACO / our samples): ``question`` + ``tests`` (see asyncrl.reward.code_reward) and an
  optional ``fn_name`` and ``solution`` (or APPS ``solutions``, a list). Other columns such as
  ``starter_code`` can go into the prompt through ``train_dataset.prompt_template``.
- ``chat``: ``messages``, a conversation as a list of ``{role, content}`` turns (ShareGPT's ``{from, value}``
  with ``human`` / ``gpt`` is read too) that ends with an assistant turn, and an optional ``answer``. The item
  keeps the conversation as ``messages``; its ``question`` is the last user turn before the final assistant
  turn, its ``solution`` the final assistant turn. The prompt is every turn before the final assistant one
  (:func:`prompt_of`); SFT trains on the assistant turns. ``train_dataset.prompt_template`` rewrites that
  last user turn. ``type: auto`` picks ``chat`` for a row with ``messages``.

A field is read from the column named in ``train_dataset.fields`` or else from its usual names
(``ALIASES``). Other columns ride along (custom reward functions receive them); a column named ``id`` is
kept as ``source_id`` because ``id`` is the stream's own unique sample id.
"""

from __future__ import annotations

import functools
import json
import re
import string
from typing import Any

from asyncrl.data.chat import normalize
from asyncrl.reward.base import UNTEMPLATED
from asyncrl.reward.code_reward import BadTestsError, parse_tests
from asyncrl.reward.math_reward import GSM8K_RE, last_boxed

ALIASES = {
    "question": ("question", "problem", "prompt", "instruction", "query"),
    "answer": ("answer", "final_answer", "expected_answer", "target"),
    "solution": ("solution", "solutions", "reference_solution", "canonical_solution", "response"),
    "tests": ("tests", "input_output", "test_cases"),
    "fn_name": ("fn_name", "entry_point"),
    "messages": ("messages", "conversations", "conversation"),
}
ROLES = {
    "system": "system",
    "developer": "developer",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "human": "user",
    "gpt": "assistant",
}  # the last two: ShareGPT's names
CALC_RE = re.compile(r"<<[^<>]*>>")


def field_value(record: dict, name: str, mapping: dict) -> tuple[str | None, Any]:
    """(column, value) of item field ``name`` in ``record``: the mapped column, else the first alias present."""
    if name in mapping:
        col = mapping[name]
        return (col, record[col]) if col in record else (col, None)
    for col in ALIASES[name]:
        if record.get(col) not in (None, ""):
            return col, record[col]
    return None, None


def detect_type(record: dict, mapping: dict) -> str:
    """The format of a row from its fields (used for ``type: auto`` on the first good row)."""
    _check_mapped(record, mapping)
    get = lambda name: field_value(record, name, mapping)[1]  # noqa: E731
    if get("messages") is not None:
        return "chat"
    if get("tests") is not None:
        return "code"
    answer, solution = get("answer"), get("solution")
    if isinstance(answer, str) and GSM8K_RE.search(answer):
        return "gsm8k"
    if isinstance(solution, str) and last_boxed(solution):  # \boxed{...} or \fbox{...}
        return "math"
    if get("question") is not None and (answer is not None or isinstance(solution, str)):
        return "qa"
    raise ValueError(
        f"cannot tell the row format from its fields {sorted(record)}; set train_dataset.type "
        "and/or map columns with train_dataset.fields.question=COLUMN (and answer/tests), or give "
        "chat rows a 'messages' list of {role, content} turns"
    )


def _check_mapped(record: dict, mapping: dict) -> None:
    """ValueError naming a mapped column the row lacks, and the columns it has."""
    missing = {name: col for name, col in mapping.items() if col not in record}
    if missing:
        name, col = next(iter(missing.items()))
        raise ValueError(
            f"fields.{name} names the column '{col}', which the row does not have (its columns: {sorted(record)[:12]})"
        )


REWARD_ARGUMENTS = ("prompt", "completion")
"""A reward function's positional parameters: columns of these names are not passed again as fields (the prompt
is the item's question)."""


def to_item(record: Any, row_type: str, mapping: dict, template: str) -> dict:
    """The item for one row; raises ValueError with a message that names the problem (not the row). A column
    mapped to an item field (``mapping``: {answer: n_vowels}) reaches the reward under both names."""
    if not isinstance(record, dict):
        raise ValueError(f"a row must be a JSON object, got {type(record).__name__}")
    _check_mapped(record, mapping)
    if row_type == "chat":
        item = _chat(record, mapping)
    else:
        col, question = field_value(record, "question", mapping)
        if not isinstance(question, str) or not question.strip():
            where = f"column '{col}'" if col else f"any of the columns {list(ALIASES['question'])}"
            raise ValueError(
                f"no question text in {where} (fields: {sorted(record)}); map it with "
                "train_dataset.fields.question=COLUMN"
            )
        item = NORMALIZERS[row_type](record, mapping)
        item["question"] = question
    if template:
        item[UNTEMPLATED] = prompt_of(item) if row_type == "chat" else item["question"]
        item["question"] = apply_template(template, {**record, **item})
        if row_type == "chat":
            item["messages"] = _with_last_question(item["messages"], item["question"])
    question_col = None if row_type == "chat" else field_value(record, "question", mapping)[0]
    for key, value in record.items():  # every other column under its own name: a mapped one under both
        if key in ("messages", "prompt_ids") and row_type != "chat":
            continue  # they would stand for the prompt (prompt_of, item_prompt_ids): only a chat row's are
        if key not in item and key != question_col and key not in REWARD_ARGUMENTS:
            item["source_id" if key == "id" else key] = value
    return item


def prompt_of(item: dict) -> str | list[dict]:
    """What an item asks, for :func:`asyncrl.workflow.rlvr.chat_prompt_ids`: a chat item's turns before its
    final assistant turn, else its ``question`` (one user turn)."""
    messages = item.get("messages")
    if not messages:
        return item["question"]
    return messages[: _final_assistant(messages)]


def chat_prompt_ids(tokenizer, question: str | list[dict]) -> list[int]:
    """Token ids of a prompt under the tokenizer's chat template, ready for the assistant: ``question`` is a
    single user turn's text, or the turns of a conversation (a chat item's prompt:
    :func:`asyncrl.data.formats.prompt_of`)."""
    messages = [{"role": "user", "content": question}] if isinstance(question, str) else question
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


TURN_MARKER = "ASYNCRLTURNMARKER"


@functools.lru_cache(maxsize=16)
def turn_end_id(tokenizer) -> int:
    """The token the chat template closes an assistant turn with (ChatML's ``<|im_end|>``), which is not always
    the tokenizer's eos (Qwen2.5 base: ``<|endoftext|>``, so a model fine-tuned to end with eos never stops where
    the template expects); the eos where the template writes no special token there."""
    eos = tokenizer.eos_token_id
    turns = [{"role": "user", "content": "x"}, {"role": "assistant", "content": TURN_MARKER}]
    try:
        text = tokenizer.apply_chat_template(turns, tokenize=False)
    except Exception:  # noqa: BLE001 - no template, or one that refuses this conversation: the eos
        return eos
    if TURN_MARKER not in text:
        return eos
    after = tokenizer(text[text.rindex(TURN_MARKER) + len(TURN_MARKER) :], add_special_tokens=False).input_ids
    added = getattr(tokenizer, "added_tokens_decoder", {})
    special = set(tokenizer.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}
    return after[0] if after and after[0] in special else eos


def stop_ids(tokenizer) -> tuple[int, ...]:
    """The tokens that end a generated answer: the template's end of turn, then the eos if it is another."""
    end, eos = turn_end_id(tokenizer), tokenizer.eos_token_id
    return (end,) if eos is None or eos == end else (end, eos)


def item_prompt_ids(tokenizer, item: dict) -> list[int]:
    """An item's prompt ids: its ``prompt_ids`` when pre-tokenised, else its prompt under the chat template (a
    chat item's turns before its final assistant turn, else its ``question`` as one user turn)."""
    return item.get("prompt_ids") or chat_prompt_ids(tokenizer, prompt_of(item))


def check_template(template: str) -> None:
    """ValueError for a prompt template that cannot build prompts: malformed, positional or naming no field."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"not a valid format string ({e}); write {{{{ and }}}} for literal braces") from None
    named = False
    for _, name, _, conversion in parsed:
        if name is None:
            continue
        first = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not first or first.isdigit():
            raise ValueError(
                f"'{{{name}}}' is a positional field: name a field such as {{question}}, and write "
                "{{}} for literal braces (e.g. \\boxed{{}})"
            )
        if conversion not in (None, "r", "s", "a"):
            raise ValueError(f"'{{{name}!{conversion}}}': the conversion must be !r, !s or !a")
        named = True
    if template and not named:
        raise ValueError("it names no field such as {question}, so every prompt would be the same text")


def apply_template(template: str, fields: dict) -> str:
    """``template`` formatted with ``fields``; ValueError naming the problem when it cannot be."""
    try:
        return template.format(**fields)
    except KeyError as e:
        raise ValueError(
            f"train_dataset.prompt_template refers to {e}, which is not among the fields {sorted(fields)}"
        ) from None
    except (IndexError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"train_dataset.prompt_template cannot be formatted ({type(e).__name__}: {e})") from None


THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _gsm8k(record: dict, mapping: dict) -> dict:
    col, answer = field_value(record, "answer", mapping)
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError(f"GSM8K answer (column '{col}') has no '#### <final answer>' line")
    work, _, final = answer.rpartition("####")
    final = THOUSANDS_RE.sub("", final.strip())  # 1,234 -> 1234; a list (2, 3) keeps its commas
    if not final:
        raise ValueError(f"GSM8K answer (column '{col}') has nothing after '####'")
    steps = CALC_RE.sub("", work).strip()
    solution = (steps + "\n" if steps else "") + f"The answer is {final}."
    return {"answer": final, "solution": solution}


def _math(record: dict, mapping: dict) -> dict:
    sol_col, solution = field_value(record, "solution", mapping)
    ans_col, answer = field_value(record, "answer", mapping)
    if answer in (None, "") and isinstance(solution, str):
        answer = last_boxed(solution) or None
    if answer in (None, ""):
        raise ValueError(f"no answer: no answer column and no \\boxed{{}} in the solution (column '{sol_col}')")
    item = {"answer": str(answer)}
    if isinstance(solution, str):
        item["solution"] = solution
    return item


def _qa(record: dict, mapping: dict) -> dict:
    ans_col, answer = field_value(record, "answer", mapping)
    sol_col, solution = field_value(record, "solution", mapping)
    has_solution = isinstance(solution, str) and bool(solution.strip())
    if answer in (None, "") and not has_solution:
        raise ValueError(
            f"no answer (fields: {sorted(record)}); map it with train_dataset.fields.answer=COLUMN "
            "(or give a solution / response for SFT)"
        )
    item = {} if answer in (None, "") else {"answer": str(answer)}
    if has_solution:
        item["solution"] = solution
    return item


def _code(record: dict, mapping: dict) -> dict:
    tests_col, tests = field_value(record, "tests", mapping)
    fn_col, fn_name = field_value(record, "fn_name", mapping)
    if tests is None:
        raise ValueError(f"no tests (fields: {sorted(record)}); map them with train_dataset.fields.tests=COLUMN")
    try:
        cases = parse_tests(tests, fn_name or None)
    except BadTestsError as e:
        raise ValueError(f"tests (column '{tests_col}'): {e}") from None
    fn_names = {c.fn_name for c in cases} - {None}
    item: dict = {
        "tests": [
            {"args": list(c.args), "expected": c.expected} if c.fn_name else {"input": c.stdin, "output": c.stdout}
            for c in cases
        ]
    }
    if fn_names:
        if len(fn_names) > 1:
            raise ValueError(f"tests call several functions {sorted(fn_names)}; one per problem is supported")
        item["fn_name"] = fn_names.pop()
    sol_col, solution = field_value(record, "solution", mapping)
    solution = _first_solution(solution)
    if solution:
        item["solution"] = solution
    return item


def _first_solution(solution: Any) -> str | None:
    """APPS stores ``solutions`` as a JSON list of programs; take the first."""
    if isinstance(solution, str) and solution.lstrip().startswith("["):
        try:
            solution = json.loads(solution)
        except json.JSONDecodeError:
            return solution
    if isinstance(solution, list):
        solution = next((s for s in solution if isinstance(s, str) and s.strip()), None)
    return solution if isinstance(solution, str) and solution.strip() else None


def _chat(record: dict, mapping: dict) -> dict:
    col, raw = field_value(record, "messages", mapping)
    if raw is None:
        raise ValueError(
            f"no conversation: no 'messages' list in column '{col or ALIASES['messages'][0]}' "
            f"(fields: {sorted(record)})"
        )
    messages = chat_messages(raw, col)
    final = _final_assistant(messages)
    if final is None:
        raise ValueError(f"'{col}' has no assistant turn: nothing to train on")
    if not messages[final]["content"].strip():
        raise ValueError(f"{col}[{final}]: the final assistant turn is empty: nothing to train on")
    if final != len(messages) - 1:
        raise ValueError(
            f"{col}[{final + 1}]: a '{messages[final + 1]['role']}' turn follows the final assistant "
            "turn; a conversation ends with the assistant's reply"
        )
    user = _last_user(messages, final)
    if user is None:
        raise ValueError(f"'{col}' has no user turn before the final assistant turn")
    if not messages[user]["content"].strip():
        raise ValueError(f"{col}[{user}]: the user turn before the final assistant turn is empty")
    item = {"messages": messages, "question": messages[user]["content"], "solution": messages[final]["content"]}
    ans_col, answer = field_value(record, "answer", mapping)
    if answer in (None, ""):  # NuminaMath-style rows: the boxed result of the solution column or the reply
        solution = field_value(record, "solution", mapping)[1]
        answer = (last_boxed(solution) if isinstance(solution, str) else None) or last_boxed(item["solution"])
    if answer not in (None, ""):
        item["answer"] = str(answer)
    return item


def chat_messages(raw: Any, col: str = "messages") -> list[dict]:
    """The turns of a conversation as chat templates take them (see :func:`asyncrl.data.chat.normalize`),
    from a list of ``{role, content}`` (or ShareGPT ``{from, value}``) objects or its JSON text; ValueError
    naming the turn that is not one."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise ValueError(f"'{col}' is text, not a list of {{role, content}} turns") from None
    if hasattr(raw, "tolist"):  # Parquet / Arrow lists arrive as arrays
        raw = raw.tolist()
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"'{col}' must be a non-empty list of {{role, content}} turns, got {type(raw).__name__}")
    turns = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ValueError(f"{col}[{i}] must be an object with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role", m.get("from"))
        if role not in ROLES:
            raise ValueError(f"{col}[{i}]: role {role!r} is not one of {sorted(set(ROLES))}")
        content = m.get("content", m.get("value"))
        turns.append({**m, "role": ROLES[role], "content": content})
    return normalize(turns)


def _final_assistant(messages: list[dict]) -> int | None:
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "assistant"), None)


def _last_user(messages: list[dict], before: int) -> int | None:
    return next((i for i in range(before - 1, -1, -1) if messages[i]["role"] == "user"), None)


def _with_last_question(messages: list[dict], question: str) -> list[dict]:
    """``messages`` with the user turn before the final assistant turn reading ``question``."""
    user = _last_user(messages, _final_assistant(messages))
    return [{**m, "content": question} if i == user else m for i, m in enumerate(messages)]


NORMALIZERS = {"gsm8k": _gsm8k, "math": _math, "qa": _qa, "code": _code, "chat": _chat}
