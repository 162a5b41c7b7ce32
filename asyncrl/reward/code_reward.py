"""Code reward: run the program in a completion against test cases inside the sandbox.

Two test styles, as code datasets write them:

- stdin/stdout: the program reads ``input`` on stdin and must print ``output`` (compared line by line,
  trailing whitespace ignored, numbers within 1e-6);
- function call: the program defines ``fn_name``; ``fn_name(*args)`` must return ``expected`` (JSON values,
  floats within 1e-6). A ``class Solution`` method of that name also counts (LeetCode style).

Accepted ``tests`` field shapes (a JSON string of any of them too): a list of ``{"input", "output"}`` or
``{"args", "expected"}`` (with ``fn_name`` per case or as its own field), or the APPS/TACO mapping
``{"inputs": [...], "outputs": [...], "fn_name"?: str}``.

The reward is the fraction of cases passed (``mode="fraction"``) or 1/0 (``mode="all"``, stops at the first
failure). A case that hits its time limit ends the run and the remaining cases count as failed, so one
slow or hostile program costs at most one time limit.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from asyncrl.reward.sandbox import Limits, RunResult, get_sandbox

FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS = {"", "python", "py", "python3"}
MODES = ("fraction", "all")


@dataclass(frozen=True)
class CodeCase:
    """One test: ``stdin`` -> ``stdout`` when ``fn_name`` is None, else ``fn_name(*args) == expected``."""

    stdin: str = ""
    stdout: str = ""
    fn_name: str | None = None
    args: tuple = ()
    expected: Any = None


class BadTestsError(ValueError):
    """The tests field of a row cannot be understood (a data problem, reported with the row)."""


def extract_code(completion: str) -> str:
    """The last fenced Python block; else the text after an unclosed fence (a truncated answer); else all."""
    blocks = [body for lang, body in FENCE_RE.findall(completion) if lang.lower() in PYTHON_TAGS]
    if blocks:
        return blocks[-1]
    opened = re.search(r"```[ \t]*(?:python3?|py)?[ \t]*\n", completion)
    if opened and "```" not in completion[opened.end() :]:
        return completion[opened.end() :]
    return completion


def parse_tests(tests: Any, fn_name: str | None = None) -> list[CodeCase]:
    """Normalise any accepted ``tests`` shape to a list of :class:`CodeCase` (raises BadTestsError)."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as e:
            raise BadTestsError(f"tests is a string but not JSON ({e.msg} at char {e.pos})") from None
    if isinstance(tests, dict):
        if "inputs" not in tests and isinstance(tests.get("input"), list):  # CodeContests' {input, output} lists
            tests = {"inputs": tests["input"], "outputs": tests.get("output")}
        if "inputs" not in tests or "outputs" not in tests:
            raise BadTestsError(f"a tests mapping needs 'inputs' and 'outputs', got keys {sorted(tests)}")
        ins, outs = tests["inputs"], tests["outputs"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise BadTestsError("tests 'inputs' and 'outputs' must be lists of the same length")
        fn_name = tests.get("fn_name") or fn_name
        tests = [{"args": i, "expected": o} if fn_name else {"input": i, "output": o} for i, o in zip(ins, outs)]
    if not isinstance(tests, list) or not tests:
        raise BadTestsError(f"tests must be a non-empty list or an inputs/outputs mapping, got {type(tests).__name__}")
    return [_case(t, fn_name, i) for i, t in enumerate(tests)]


def _case(t: Any, fn_name: str | None, index: int) -> CodeCase:
    """A function-call case when a function name is known (per case or per item), else stdin/stdout."""
    if not isinstance(t, dict):
        raise BadTestsError(f"test {index} must be a mapping, got {type(t).__name__}")
    name = t.get("fn_name") or fn_name
    if name:
        if not ("args" in t or "input" in t) or not ("expected" in t or "output" in t):
            raise BadTestsError(f"test {index} calls {name}() but lacks 'args'/'expected', got {sorted(t)}")
        args = t["args"] if "args" in t else t["input"]
        return CodeCase(
            fn_name=name,
            args=tuple(args if isinstance(args, list) else [args]),
            expected=t["expected"] if "expected" in t else t["output"],
        )
    if "input" not in t or "output" not in t:
        hint = " (a function-call test needs fn_name)" if "args" in t else ""
        raise BadTestsError(f"test {index} needs 'input' and 'output'{hint}, got {sorted(t)}")
    return CodeCase(stdin=_text(t["input"]), stdout=_text(t["output"]))


def _text(v: Any) -> str:
    return "\n".join(map(str, v)) if isinstance(v, list) else str(v)


def outputs_match(got: str, expected: str, tol: float = 1e-6) -> bool:
    """Line-by-line equality ignoring trailing whitespace and blank trailing lines; tokens that are both
    numbers may differ by ``tol`` (absolute or relative), unless both are integers."""
    g, e = _lines(got), _lines(expected)
    if g == e:
        return True
    if len(g) != len(e):
        return False
    for gl, el in zip(g, e):
        gt, et = gl.split(), el.split()
        if len(gt) != len(et) or not all(a == b or _close(a, b, tol) for a, b in zip(gt, et)):
            return False
    return True


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _close(a: Any, b: Any, tol: float) -> bool:
    """Numbers within ``tol``; two integers only when equal (a wrong answer of 10 digits is not within 1e-6,
    and integers of any length are compared as written); inf and nan only as themselves (an integer beyond the
    float range is not inf)."""
    if _integer(a) and _integer(b):
        return _integer_text(a) == _integer_text(b)
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError, OverflowError):
        return False
    if not (math.isfinite(x) and math.isfinite(y)):
        return _non_finite(a) and _non_finite(b) and (x == y or (math.isnan(x) and math.isnan(y)))
    return math.isclose(x, y, rel_tol=tol, abs_tol=tol)


def _integer_text(v: Any) -> str:
    """An integer token as written, without '+' and leading zeros (no int(): Python refuses over 4300 digits).
    Integer values come from JSON, which never holds more."""
    if isinstance(v, int):
        return str(v)
    digits = v.lstrip("+-").lstrip("0") or "0"
    return ("-" if v.startswith("-") and digits != "0" else "") + digits


def _non_finite(v: Any) -> bool:
    """inf, -inf or nan as a value or as written ('inf', 'Infinity', 'nan'), not as a number too large."""
    if isinstance(v, float):
        return not math.isfinite(v)
    return isinstance(v, str) and v.strip().lstrip("+-").lower() in ("inf", "infinity", "nan")


def _integer(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, str) and INTEGER_RE.fullmatch(v) is not None
    )


INTEGER_RE = re.compile(r"[+-]?\d+")


def values_match(got: Any, expected: Any, tol: float = 1e-6) -> bool:
    """Structural equality of JSON values; floats within ``tol``; a one-element list wrapping the expected
    value (the APPS convention for function outputs) also matches."""
    if _value_eq(got, expected, tol):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _value_eq(got, expected[0], tol)


def _value_eq(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or _close(a, b, tol)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_value_eq(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_value_eq(a[k], b[k], tol) for k in a)
    return a == b


def case_passed(case: CodeCase, result: RunResult) -> bool:
    """Did one sandboxed run satisfy ``case``?"""
    if not result.ok:
        return False
    if case.fn_name is None:
        return outputs_match(result.stdout, case.stdout)
    if result.returned is None:
        return False
    try:
        got = json.loads(result.returned)
    except json.JSONDecodeError:
        return False
    return values_match(got, json.loads(json.dumps(case.expected, default=repr)))


def run_tests(
    code: str,
    cases: list[CodeCase],
    limits: Limits,
    sandbox: str = "auto",
    stop_on_failure: bool = False,
    python: str | None = None,
) -> list[str]:
    """Run ``code`` on each case; one status per case: passed | failed | timeout | skipped."""
    box = get_sandbox(sandbox, python)
    statuses: list[str] = []
    for case in cases:
        call = (case.fn_name, list(case.args)) if case.fn_name else None
        result = box.run(code, stdin=case.stdin, call=call, limits=limits)
        status = "timeout" if result.timed_out else "passed" if case_passed(case, result) else "failed"
        statuses.append(status)
        if status == "timeout" or (stop_on_failure and status != "passed"):
            break
    return statuses + ["skipped"] * (len(cases) - len(statuses))


def code_reward(
    prompt: str,
    completion: str,
    tests: Any = None,
    fn_name: str | None = None,
    *,
    mode: str = "fraction",
    cpu_s: float = 2.0,
    wall_s: float | None = None,
    memory_mb: int = 512,
    nproc: int = 16,
    sandbox: str = "auto",
    python: str | None = None,
    max_tests: int = 0,
    **_,
) -> float:
    """Fraction of test cases the completion's program passes (``mode='fraction'``), or 1.0 only if it passes
    them all (``mode='all'``). Each case runs in its own sandbox with ``cpu_s`` of CPU time and ``wall_s``
    (default 2 x cpu_s + 1) of wall time; ``max_tests`` > 0 runs only the first that many cases.
    ``python`` is the interpreter for the program (default the system's /usr/bin/python3, which has no
    site-packages: programs get the standard library only)."""
    if mode not in MODES:
        raise ValueError(f"code_reward mode must be one of {MODES}, got {mode!r}")
    if tests is None:
        raise ValueError("code_reward needs a 'tests' field on the item")
    cases = parse_tests(tests, fn_name)
    if max_tests > 0:
        cases = cases[:max_tests]
    code = extract_code(completion)
    if not code.strip():
        return 0.0
    limits = Limits(
        cpu_s=cpu_s, wall_s=wall_s if wall_s is not None else 2 * cpu_s + 1, memory_mb=memory_mb, nproc=nproc
    )
    statuses = run_tests(code, cases, limits, sandbox, stop_on_failure=mode == "all", python=python)
    passed = statuses.count("passed")
    if mode == "all":
        return float(passed == len(cases))
    return passed / len(cases)


def describe(sandbox: str = "auto", python: str | None = None, **_) -> dict:
    """Constant facts for the reward service's metrics: which isolation the sandbox uses on this machine."""
    return {"sandbox": get_sandbox(sandbox, python).description}


code_reward.describe = describe
