"""The small sample datasets shipped in ``asyncrl/assets/data/``, generated here (no hub downloads).

``python -m asyncrl.data.samples`` rewrites them; ``--check`` only verifies that the shipped files are what
this generator produces. Every problem is written from our own templates with a seeded RNG:

- ``gsm8k_{train,test}.jsonl``: GSM8K-format word problems (``question``; ``answer`` = worked steps with
  calculator annotations and a final ``#### N`` line);
- ``math_{train,test}.jsonl``: MATH-format problems (``problem``, ``solution`` ending in ``\\boxed{}``,
  ``level``, ``type``);
- ``code_{train,test}.jsonl``: code problems with a reference ``solution`` and ``tests``, half
  stdin/stdout and half function-call (``fn_name``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from fractions import Fraction
from pathlib import Path
from typing import Callable

DATA_DIR = Path(__file__).resolve().parents[1] / "assets" / "data"
NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kemi",
    "Luis",
    "Maya",
    "Noor",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
]
THINGS = ["marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards", "beads"]


# ---- GSM8K-format word problems -------------------------------------------------------------------------
def _gsm_packs(rng: random.Random) -> tuple[str, list[str], int]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b, c = rng.randint(3, 40), rng.randint(2, 9), rng.randint(2, 12)
    q = (
        f"{name} has {a} {thing}. {name} buys {b} packs of {thing} with {c} {thing} in each pack. "
        f"How many {thing} does {name} have now?"
    )
    return (
        q,
        [
            f"The packs hold {b} * {c} = <<{b}*{c}={b * c}>>{b * c} {thing}.",
            f"{name} now has {a} + {b * c} = <<{a}+{b * c}={a + b * c}>>{a + b * c} {thing}.",
        ],
        a + b * c,
    )


def _gsm_tickets(rng: random.Random) -> tuple[str, list[str], int]:
    a, b = rng.randint(20, 300), rng.randint(5, 90)
    place = rng.choice(["museum", "cinema", "zoo", "theatre"])
    q = (
        f"A {place} sold {a} tickets on Monday and {b} more tickets on Tuesday than on Monday. "
        "How many tickets did it sell on the two days together?"
    )
    return (
        q,
        [
            f"On Tuesday it sold {a} + {b} = <<{a}+{b}={a + b}>>{a + b} tickets.",
            f"Together it sold {a} + {a + b} = <<{a}+{a + b}={2 * a + b}>>{2 * a + b} tickets.",
        ],
        2 * a + b,
    )


def _gsm_savings(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    rate, hours, weeks = rng.randint(8, 25), rng.randint(5, 20), rng.randint(2, 8)
    spend = rng.randint(10, rate * hours - 5)
    earn, save = rate * hours, rate * hours - spend
    q = (
        f"{name} earns ${rate} an hour and works {hours} hours a week. Each week {name} spends ${spend} "
        f"on food. How many dollars does {name} save in {weeks} weeks?"
    )
    return (
        q,
        [
            f"Each week {name} earns {rate} * {hours} = <<{rate}*{hours}={earn}>>{earn} dollars.",
            f"{name} saves {earn} - {spend} = <<{earn}-{spend}={save}>>{save} dollars a week.",
            f"In {weeks} weeks that is {save} * {weeks} = <<{save}*{weeks}={save * weeks}>>{save * weeks} dollars.",
        ],
        save * weeks,
    )


def _gsm_reading(rng: random.Random) -> tuple[str, list[str], int]:
    name, per_day, days = rng.choice(NAMES), rng.randint(5, 30), rng.randint(2, 9)
    pages = per_day * days + rng.randint(1, 150)
    read, left = per_day * days, pages - per_day * days
    q = f"{name} reads {per_day} pages of a {pages}-page book every day. How many pages are left after {days} days?"
    return (
        q,
        [
            f"In {days} days {name} reads {per_day} * {days} = <<{per_day}*{days}={read}>>{read} pages.",
            f"There are {pages} - {read} = <<{pages}-{read}={left}>>{left} pages left.",
        ],
        left,
    )


def _gsm_share(rng: random.Random) -> tuple[str, list[str], int]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    friends, each, kept = rng.randint(2, 8), rng.randint(2, 15), rng.randint(1, 20)
    total = friends * each + kept
    q = (
        f"{name} shares {total} {thing} equally among {friends} friends and keeps the {kept} that are left "
        f"over. How many {thing} does each friend get?"
    )
    return (
        q,
        [
            f"{name} gives away {total} - {kept} = <<{total}-{kept}={total - kept}>>{total - kept} {thing}.",
            f"Each friend gets {total - kept} / {friends} = <<{total - kept}/{friends}={each}>>{each} {thing}.",
        ],
        each,
    )


GSM_TEMPLATES = [_gsm_packs, _gsm_tickets, _gsm_savings, _gsm_reading, _gsm_share]


def gsm8k_rows(seed: int, n: int) -> list[dict]:
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < n:
        question, steps, answer = rng.choice(GSM_TEMPLATES)(rng)
        if question not in seen:
            seen.add(question)
            rows.append({"question": question, "answer": "\n".join(steps) + f"\n#### {answer}"})
    return rows


# ---- MATH-format problems -------------------------------------------------------------------------------
def _latex_frac(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    sign = "-" if x < 0 else ""
    return f"{sign}\\frac{{{abs(x.numerator)}}}{{{x.denominator}}}"


def _math_fraction_sum(rng: random.Random) -> dict:
    a, b, c, d = rng.randint(1, 9), rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 12)
    x, y = Fraction(a, b), Fraction(c, d)
    lcd = b * d // math.gcd(b, d)
    return {
        "problem": f"What is $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$? Express your answer as a common fraction.",
        "solution": f"The least common denominator is ${lcd}$, so $\\frac{{{a}}}{{{b}}} + "
        f"\\frac{{{c}}}{{{d}}} = \\frac{{{a * lcd // b}}}{{{lcd}}} + \\frac{{{c * lcd // d}}}{{{lcd}}}"
        f" = \\boxed{{{_latex_frac(x + y)}}}$.",
        "level": "Level 2",
        "type": "Prealgebra",
    }


def _math_linear(rng: random.Random) -> dict:
    a, b, c = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, -2, -3]), rng.randint(-20, 20), rng.randint(-30, 30)
    x = Fraction(c - b, a)
    sign = "+" if b >= 0 else "-"
    return {
        "problem": f"Solve for $x$: ${a}x {sign} {abs(b)} = {c}$.",
        "solution": f"Subtracting ${b}$ from both sides gives ${a}x = {c - b}$, so $x = \\boxed{{{_latex_frac(x)}}}$.",
        "level": "Level 1",
        "type": "Algebra",
    }


def _math_gcd(rng: random.Random) -> dict:
    g = rng.randint(2, 30)
    a, b = g * rng.randint(2, 20), g * rng.randint(2, 20)
    return {
        "problem": f"What is the greatest common divisor of ${a}$ and ${b}$?",
        "solution": f"By the Euclidean algorithm, $\\gcd({a}, {b}) = \\boxed{{{math.gcd(a, b)}}}$.",
        "level": "Level 2",
        "type": "Number Theory",
    }


def _math_power(rng: random.Random) -> dict:
    base, exp = rng.randint(2, 9), rng.randint(2, 5)
    return {
        "problem": f"Compute $\\sqrt{{{base}^{{{2 * exp}}}}}$.",
        "solution": f"$\\sqrt{{{base}^{{{2 * exp}}}}} = {base}^{{{exp}}} = \\boxed{{{base**exp}}}$.",
        "level": "Level 1",
        "type": "Algebra",
    }


def _math_expand(rng: random.Random) -> dict:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return {
        "problem": f"Expand $(x+{a})(x+{b})$.",
        "solution": f"$(x+{a})(x+{b}) = x^2 + {a}x + {b}x + {a * b} = \\boxed{{x^2 + {a + b}x + {a * b}}}$.",
        "level": "Level 2",
        "type": "Algebra",
    }


MATH_TEMPLATES = [_math_fraction_sum, _math_linear, _math_gcd, _math_power, _math_expand]


def math_rows(seed: int, n: int) -> list[dict]:
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < n:
        row = rng.choice(MATH_TEMPLATES)(rng)
        if row["problem"] not in seen:
            seen.add(row["problem"])
            rows.append(row)
    return rows


# ---- code problems ------------------------------------------------------------------------------------
def _stdio(question: str, solution: str, fn: Callable[[str], str], inputs: list[str]) -> dict:
    return {
        "question": question,
        "solution": f"```python\n{solution}```",
        "tests": [{"input": i, "output": fn(i)} for i in inputs],
    }


def _call(question: str, fn_name: str, solution: str, fn: Callable, args: list[list]) -> dict:
    return {
        "question": question,
        "fn_name": fn_name,
        "solution": f"```python\n{solution}```",
        "tests": [{"args": a, "expected": fn(*a)} for a in args],
    }


def _code_sum_pair(rng):
    k = rng.randint(2, 9)
    return _stdio(
        f"Read two integers a and b from one line of standard input and print {k} * a + b.",
        f"a, b = map(int, input().split())\nprint({k} * a + b)\n",
        lambda s: f"{k * int(s.split()[0]) + int(s.split()[1])}\n",
        [f"{rng.randint(-50, 50)} {rng.randint(-50, 50)}\n" for _ in range(4)],
    )


def _code_reverse_words(rng):
    words = ["alpha", "beta", "gamma", "delta", "kiwi", "lime", "mango", "plum", "sky", "sea"]
    return _stdio(
        "Read a line of words from standard input and print the words in reverse order, separated by single spaces.",
        "print(' '.join(reversed(input().split())))\n",
        lambda s: " ".join(reversed(s.split())) + "\n",
        [" ".join(rng.sample(words, rng.randint(2, 6))) + "\n" for _ in range(4)],
    )


def _code_count_char(rng):
    ch = rng.choice("aeiou")
    words = ["banana", "apple", "kiwi", "orange", "avocado", "blueberry", "coconut", "eggplant"]
    return _stdio(
        f"Read a line from standard input and print how many times the letter '{ch}' appears in it.",
        f"print(input().count('{ch}'))\n",
        lambda s: f"{s.strip().count(ch)}\n",
        [" ".join(rng.sample(words, 3)) + "\n" for _ in range(4)],
    )


def _code_max_list(rng):
    return _stdio(
        "The first line of standard input holds n, the second n integers. Print the largest and "
        "the smallest of them, separated by a space.",
        "input()\nxs = list(map(int, input().split()))\nprint(max(xs), min(xs))\n",
        lambda s: (lambda xs: f"{max(xs)} {min(xs)}\n")(list(map(int, s.split("\n")[1].split()))),
        [
            (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")(
                [rng.randint(-99, 99) for _ in range(rng.randint(1, 8))]
            )
            for _ in range(4)
        ],
    )


def _code_fizz(rng):
    a, b = rng.choice([(2, 3), (3, 5), (2, 7), (3, 4)])

    def fizz(s):
        n = int(s)
        return "".join(("Fizz" * (i % a == 0) + "Buzz" * (i % b == 0) or str(i)) + "\n" for i in range(1, n + 1))

    return _stdio(
        f"Read n from standard input. For i from 1 to n print 'Fizz' if i is divisible by {a}, 'Buzz' "
        f"if it is divisible by {b}, 'FizzBuzz' if both, else i itself; one per line.",
        f"n = int(input())\nfor i in range(1, n + 1):\n"
        f"    out = 'Fizz' * (i % {a} == 0) + 'Buzz' * (i % {b} == 0)\n"
        "    print(out or i)\n",
        fizz,
        [f"{rng.randint(1, 20)}\n" for _ in range(3)],
    )


def _code_sum_squares(rng):
    p = rng.choice([2, 3])
    return _call(
        f"Write a Python function sum_powers(xs) that returns the sum of the {p}-th powers of the "
        "integers in the list xs.",
        "sum_powers",
        f"def sum_powers(xs):\n    return sum(x ** {p} for x in xs)\n",
        lambda xs: sum(x**p for x in xs),
        [[[rng.randint(-9, 9) for _ in range(rng.randint(0, 6))]] for _ in range(4)],
    )


def _code_is_prime(rng):
    return _call(
        "Write a Python function is_prime(n) that returns True if the integer n is prime and False otherwise.",
        "is_prime",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n"
        "        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
        lambda n: n >= 2 and all(n % i for i in range(2, math.isqrt(n) + 1)),
        [[rng.randint(-3, 120)] for _ in range(5)],
    )


def _code_fib(rng):
    a, b = rng.randint(0, 3), rng.randint(1, 4)

    def fib(n):
        x, y = a, b
        for _ in range(n):
            x, y = y, x + y
        return x

    return _call(
        f"Write a Python function seq(n) that returns the n-th term (counting from 0) of the sequence "
        f"that starts {a}, {b} and in which every later term is the sum of the two before it.",
        "seq",
        f"def seq(n):\n    x, y = {a}, {b}\n    for _ in range(n):\n        x, y = y, x + y\n    return x\n",
        fib,
        [[rng.randint(0, 30)] for _ in range(4)],
    )


def _code_gcd(rng):
    return _call(
        "Write a Python function gcd_list(xs) that returns the greatest common divisor of a non-empty "
        "list of positive integers.",
        "gcd_list",
        "import math\n\ndef gcd_list(xs):\n    g = 0\n    for x in xs:\n        g = math.gcd(g, x)\n    return g\n",
        lambda xs: math.gcd(*xs),
        [[[rng.randint(1, 12) * k for _ in range(rng.randint(1, 4))]] for k in rng.sample(range(1, 20), 4)],
    )


def _code_palindrome(rng):
    words = ["level", "rotor", "banana", "noon", "python", "racecar", "abca", "stats", "kayak", "tree"]
    return _call(
        "Write a Python function is_palindrome(s) that returns True if the string s reads the same "
        "backwards, ignoring case.",
        "is_palindrome",
        "def is_palindrome(s):\n    t = s.lower()\n    return t == t[::-1]\n",
        lambda s: s.lower() == s.lower()[::-1],
        [[rng.choice(words).capitalize() if rng.random() < 0.5 else rng.choice(words)] for _ in range(5)],
    )


CODE_TEMPLATES = [
    _code_sum_pair,
    _code_reverse_words,
    _code_count_char,
    _code_max_list,
    _code_fizz,
    _code_sum_squares,
    _code_is_prime,
    _code_fib,
    _code_gcd,
    _code_palindrome,
]


def code_rows(seed: int, n: int) -> list[dict]:
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < n:
        row = rng.choice(CODE_TEMPLATES)(rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows


# ---- files ----------------------------------------------------------------------------------------------
def render_all() -> dict[str, str]:
    """File name -> JSONL text of every sample file. Train and test are one pool of distinct prompts split
    in two, so no test prompt is ever trained on."""
    files = {}
    for stem, make, n_train, n_test in [
        ("gsm8k", gsm8k_rows, 200, 40),
        ("math", math_rows, 60, 20),
        ("code", code_rows, 24, 8),
    ]:
        pool = make(1, n_train + n_test)
        for split, rows in (("train", pool[:n_train]), ("test", pool[n_train:])):
            files[f"{stem}_{split}.jsonl"] = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only verify the shipped files")
    parser.add_argument("--out", default=str(DATA_DIR), help="directory to write (default: the package's)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    stale = []
    for name, text in render_all().items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({text.count(chr(10))} rows)")
    if stale:
        print(f"out of date: {stale}; run python -m asyncrl.data.samples", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
