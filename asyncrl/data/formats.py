"""Turning a raw row into an item: ``question`` (the user turn) plus the fields its reward function takes.

Recognised formats (``train_dataset.type``):

- ``gsm8k``: ``question`` + ``answer`` whose last line is ``#### 42``; the item's ``answer`` is ``42`` and
  its ``solution`` is the worked text (calculator annotations ``<<6*7=42>>`` removed) ending with
  ``The answer is 42.``
- ``math`` (MATH / MATH-500): ``problem`` + ``solution`` with ``\\boxed{}``; ``answer`` is the given answer
  column or the last boxed expression of the solution.
- ``qa``: ``question`` + ``answer``.
- ``code`` (APPS / TACO / our samples): ``question`` + ``tests`` (see asyncrl.reward.code_reward) and an
  optional ``fn_name`` and ``solution`` (or APPS ``solutions``, a list). Other columns such as
  ``starter_code`` can go into the prompt through ``train_dataset.prompt_template``.

A field is read from the column named in ``train_dataset.fields`` or else from its usual names
(``ALIASES``). Other columns ride along (custom reward functions receive them); a column named ``id`` is
kept as ``source_id`` because ``id`` is the stream's own unique sample id.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

from asyncrl.reward.code_reward import BadTestsError, parse_tests
from asyncrl.reward.math_reward import GSM8K_RE, last_boxed

ALIASES = {
    "question": ("question", "problem", "prompt", "instruction", "query"),
    "answer": ("answer", "final_answer", "expected_answer", "target"),
    "solution": ("solution", "solutions", "reference_solution", "canonical_solution"),
    "tests": ("tests", "input_output", "test_cases"),
    "fn_name": ("fn_name", "entry_point"),
}
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
    get = lambda name: field_value(record, name, mapping)[1]  # noqa: E731
    if get("tests") is not None:
        return "code"
    answer, solution = get("answer"), get("solution")
    if isinstance(answer, str) and GSM8K_RE.search(answer):
        return "gsm8k"
    if isinstance(solution, str) and "\\boxed" in solution:
        return "math"
    if get("question") is not None and answer is not None:
        return "qa"
    raise ValueError(f"cannot tell the row format from its fields {sorted(record)}; set train_dataset.type "
                     "and/or map columns with train_dataset.fields.question=COLUMN (and answer/tests)")


def to_item(record: Any, row_type: str, mapping: dict, template: str) -> dict:
    """The item for one row; raises ValueError with a message that names the problem (not the row)."""
    if not isinstance(record, dict):
        raise ValueError(f"a row must be a JSON object, got {type(record).__name__}")
    col, question = field_value(record, "question", mapping)
    if not isinstance(question, str) or not question.strip():
        where = f"column '{col}'" if col else f"any of the columns {list(ALIASES['question'])}"
        raise ValueError(f"no question text in {where} (fields: {sorted(record)}); map it with "
                         "train_dataset.fields.question=COLUMN")
    item, used = NORMALIZERS[row_type](record, mapping)
    item["question"] = question
    used.add(col)
    if template:
        item["question"] = apply_template(template, {**record, **item})
    for key, value in record.items():
        if key not in used and key not in item:
            item["source_id" if key == "id" else key] = value
    return item


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
            raise ValueError(f"'{{{name}}}' is a positional field: name a field such as {{question}}, and write "
                             "{{}} for literal braces (e.g. \\boxed{{}})")
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
        raise ValueError(f"train_dataset.prompt_template refers to {e}, which is not among the fields "
                         f"{sorted(fields)}") from None
    except (IndexError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"train_dataset.prompt_template cannot be formatted ({type(e).__name__}: {e})") from None


def _gsm8k(record: dict, mapping: dict) -> tuple[dict, set]:
    col, answer = field_value(record, "answer", mapping)
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError(f"GSM8K answer (column '{col}') has no '#### <final answer>' line")
    work, _, final = answer.rpartition("####")
    final = final.strip().replace(",", "")
    if not final:
        raise ValueError(f"GSM8K answer (column '{col}') has nothing after '####'")
    steps = CALC_RE.sub("", work).strip()
    solution = (steps + "\n" if steps else "") + f"The answer is {final}."
    return {"answer": final, "solution": solution}, {col}


def _math(record: dict, mapping: dict) -> tuple[dict, set]:
    sol_col, solution = field_value(record, "solution", mapping)
    ans_col, answer = field_value(record, "answer", mapping)
    if answer in (None, "") and isinstance(solution, str):
        answer = last_boxed(solution) or None
    if answer in (None, ""):
        raise ValueError(f"no answer: no answer column and no \\boxed{{}} in the solution (column '{sol_col}')")
    item = {"answer": str(answer)}
    if isinstance(solution, str):
        item["solution"] = solution
    return item, {sol_col, ans_col}


def _qa(record: dict, mapping: dict) -> tuple[dict, set]:
    ans_col, answer = field_value(record, "answer", mapping)
    if answer in (None, ""):
        raise ValueError(f"no answer (fields: {sorted(record)}); map it with train_dataset.fields.answer=COLUMN")
    sol_col, solution = field_value(record, "solution", mapping)
    item = {"answer": str(answer)}
    if isinstance(solution, str):
        item["solution"] = solution
    return item, {ans_col, sol_col}


def _code(record: dict, mapping: dict) -> tuple[dict, set]:
    tests_col, tests = field_value(record, "tests", mapping)
    fn_col, fn_name = field_value(record, "fn_name", mapping)
    if tests is None:
        raise ValueError(f"no tests (fields: {sorted(record)}); map them with train_dataset.fields.tests=COLUMN")
    try:
        cases = parse_tests(tests, fn_name or None)
    except BadTestsError as e:
        raise ValueError(f"tests (column '{tests_col}'): {e}") from None
    fn_names = {c.fn_name for c in cases} - {None}
    item: dict = {"tests": [{"args": list(c.args), "expected": c.expected} if c.fn_name else
                            {"input": c.stdin, "output": c.stdout} for c in cases]}
    if fn_names:
        if len(fn_names) > 1:
            raise ValueError(f"tests call several functions {sorted(fn_names)}; one per problem is supported")
        item["fn_name"] = fn_names.pop()
    sol_col, solution = field_value(record, "solution", mapping)
    solution = _first_solution(solution)
    if solution:
        item["solution"] = solution
    return item, {tests_col, fn_col, sol_col}


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


NORMALIZERS = {"gsm8k": _gsm8k, "math": _math, "qa": _qa, "code": _code}
