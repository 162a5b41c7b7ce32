"""Preference pairs for ``asyncrl rm`` on the built-in arithmetic task, with a known preference: the worked
solution (chosen) over the same solution with one slip, a line whose result is off by a few, carried to the final
answer (rejected). Writes JSONL rows {"prompt", "chosen", "rejected"}:

    python examples/preference_pairs.py --n 2000 --out outputs/pairs.jsonl
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


def pairs(n: int, seed: int) -> list[dict]:
    task, rng = ArithTask(), random.Random(seed)
    rows = []
    for _ in range(n):
        p = task.problem(rng)
        rows.append({"prompt": p["question"], "chosen": p["solution"], "rejected": with_a_slip(p["solution"], rng)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("outputs/pairs.jsonl"))
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in pairs(args.n, args.seed)))
    print(f"{args.n} pairs -> {args.out}")


if __name__ == "__main__":
    main()
