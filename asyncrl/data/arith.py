"""The built-in verifiable task: multi-step integer arithmetic with a written-out chain of thought.

A problem is a chain such as ``Compute 37 + 15 - 8 + 24.``; the worked solution does one operation per
line and ends with ``The answer is 68.``. Only the final answer is checked (reward 1 or 0), so a model may
reason however it likes. Problems come from a seeded generator; the held-out split is drawn from its own
seed, and :mod:`asyncrl.data` keeps its problems out of the training stream.

With ``direct_frac`` > 0, that fraction of reference solutions skip the working and state the answer
directly, as much web text does. A model fine-tuned on such a mixture sometimes reasons step by step and
sometimes guesses; the built-in SFT checkpoint is made this way, and RL has to discover that writing the
steps out pays.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Iterator

ANSWER_RE = re.compile(r"answer is\s*(-?\d+)(?![.,]?\d)")  # an integer: 'answer is 6.5' is no answer
OPS = "+-*"
MAX_REPEATS = 10_000  # draws in a row that find no new problem before a split gives up


@dataclass(frozen=True)
class ArithTask:
    """Generator of chain-arithmetic problems.

    Difficulty grows with the number of terms and the operand range; ``*`` multiplies by a single digit.
    """

    min_terms: int = 3
    max_terms: int = 5
    max_operand: int = 99
    ops: str = "+-"
    max_value: int = 999
    direct_frac: float = 0.0

    def __post_init__(self):
        """A bad option raises ValueError; the message starts with the option's name."""
        if not self.ops or set(self.ops) - set(OPS):
            raise ValueError(f"ops must be made of the operators {' '.join(OPS)} (e.g. '+-'), got {self.ops!r}")
        if self.min_terms < 2:
            raise ValueError(f"min_terms must be >= 2 (a problem has at least one operation), got {self.min_terms}")
        if self.max_terms < self.min_terms:
            raise ValueError(f"max_terms ({self.max_terms}) must be >= min_terms ({self.min_terms})")
        if self.max_operand < 2:
            raise ValueError(f"max_operand must be >= 2, got {self.max_operand}")
        if not 0 <= self.direct_frac <= 1:
            raise ValueError(f"direct_frac must be in [0, 1], got {self.direct_frac}")

    def problem(self, rng: random.Random) -> dict:
        n_terms = rng.randint(self.min_terms, self.max_terms)
        value = rng.randint(2, self.max_operand)
        question = [str(value)]
        lines = []
        for _ in range(n_terms - 1):
            op = rng.choice(self.ops)
            operand = rng.randint(2, 9) if op == "*" else rng.randint(1, self.max_operand)
            result = _apply(value, op, operand)
            if not 0 <= result <= self.max_value:  # keep every intermediate value small and non-negative
                op, operand = ("-", rng.randint(1, max(1, value))) if result > self.max_value else ("+", operand)
                result = _apply(value, op, operand)
            question.append(f"{op} {operand}")
            lines.append(f"{value} {op} {operand} = {result}")
            value = result
        lines.append(f"The answer is {value}.")
        text = f"Compute {' '.join(question)}."
        if _unit_hash(text) < self.direct_frac:  # not drawn from rng: the problem streams stay the same
            lines = lines[-1:]
        return {"question": text, "solution": "\n".join(lines), "answer": str(value)}

    def stream(self, seed: int) -> Iterator[dict]:
        """Endless training problems."""
        rng = random.Random(seed)
        while True:
            yield self.problem(rng)

    def split(self, seed: int, size: int) -> list[dict]:
        """A fixed list of ``size`` distinct problems (the held-out split); ValueError when the options allow
        too few distinct problems."""
        return distinct_problems(self.problem, seed, size)


def distinct_problems(problem, seed: int, size: int) -> list[dict]:
    """``size`` items of ``problem(rng)`` with distinct questions, from ``random.Random(seed)``; ValueError when
    the generator repeats itself too often to give that many."""
    rng, seen, items, repeats = random.Random(seed), set(), [], 0
    while len(items) < size:
        item = problem(rng)
        if item["question"] in seen:
            repeats += 1
            if repeats >= MAX_REPEATS:
                raise ValueError(f"its options allow only about {len(items)} distinct problems, fewer than {size}")
            continue
        repeats = 0
        seen.add(item["question"])
        items.append(item)
    return items


def _unit_hash(text: str) -> float:
    """A deterministic number in [0, 1) for ``text``."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def extract_answer(text: str) -> str | None:
    """The integer after the last ``answer is`` in ``text``, or None."""
    found = ANSWER_RE.findall(text)
    return found[-1] if found else None


def arith_reward(prompt: str, completion: str, answer: str, **_) -> float:
    """1.0 when the completion's final answer equals the reference answer, else 0.0."""
    got = extract_answer(completion)
    return 1.0 if got is not None and int(got) == int(answer) else 0.0
