"""Preference pairs for ``asyncrl rm`` on the built-in arithmetic task, with a known preference. Writes JSONL rows
{"prompt", "chosen", "rejected"}:

    python examples/preference_pairs.py --n 2000 --out outputs/pairs.jsonl [--rejected guess|slip]

- ``guess`` (default): the worked solution (chosen) over a bare guessed answer, off by a few (rejected): the
  careful way over the careless one, which a small model's reward model learns within a hundred steps;
- ``slip``: the worked solution over the same solution with one slip, a line whose result is off by a few,
  carried to the final answer: telling these apart means checking the arithmetic (much harder for a small trunk).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from asyncrl.data.arith import ArithTask


def with_a_slip(solution: str, rng: random.Random) -> str:
    """``solution`` with the result of one line off by 1-9, and every later line and the answer following it."""
    lines = solution.splitlines()
    steps = [i for i, line in enumerate(lines) if "=" in line]
    if not steps:  # a direct answer: the answer itself is off
        value = int(re.search(r"-?\d+", lines[-1]).group())
        return f"The answer is {value + rng.choice([-1, 1]) * rng.randint(1, 9)}."
    k = rng.choice(steps)
    delta = rng.choice([-1, 1]) * rng.randint(1, 9)
    out = lines[:k]
    value = None
    for line in lines[k:]:
        m = re.fullmatch(r"(-?\d+) ([-+*]) (\d+) = (-?\d+)", line)
        if m is None:  # the answer line
            out.append(f"The answer is {value}.")
            continue
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        if value is not None:
            a = value
        value = {"+": a + b, "-": a - b, "*": a * b}[op] + (delta if value is None else 0)
        out.append(f"{a} {op} {b} = {value}")
    return "\n".join(out)


def a_guess(answer: str, rng: random.Random) -> str:
    """A bare answer, off by 1-9: what a careless policy writes."""
    return f"The answer is {int(answer) + rng.choice([-1, 1]) * rng.randint(1, 9)}."


def pairs(n: int, seed: int, rejected: str = "guess") -> list[dict]:
    task, rng = ArithTask(), random.Random(seed)
    rows = []
    for _ in range(n):
        p = task.problem(rng)
        worse = a_guess(p["answer"], rng) if rejected == "guess" else with_a_slip(p["solution"], rng)
        rows.append({"prompt": p["question"], "chosen": p["solution"], "rejected": worse})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("outputs/pairs.jsonl"))
    ap.add_argument("--rejected", choices=("guess", "slip"), default="guess")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in pairs(args.n, args.seed, args.rejected)))
    print(f"{args.n} pairs -> {args.out}")


if __name__ == "__main__":
    main()
