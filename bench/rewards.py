"""Reward throughput on this machine: math-verify calls/s and sandboxed code executions/s.

    python bench/rewards.py [--math N] [--code N] [--workers W]

Math: a mix of answer forms with distinct values (plain numbers and simple fractions take the exact fast
path; expressions, roots and free text go to math-verify), scored in-process and through the reward
service with W worker processes. Code: a
stdin/stdout test case per execution (spawn sandbox, run python, compare), for every isolation mechanism
that works here, serially and through the service. Numbers vary by +-25 % on a shared 2-core VM.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from asyncrl.reward import BoundReward, RewardService
from asyncrl.reward.code_reward import code_reward
from asyncrl.reward.math_reward import math_reward
from asyncrl.reward.sandbox import MECHANISMS, Limits, available, default_python, probe

MATH_MIX = [  # (completion, gold) for value i: distinct values, so no parse cache helps
    lambda i: (f"The answer is {i}.", f"{i}"),
    lambda i: (f"Adding up:\n#### {i},250", f"{i}250"),
    lambda i: (f"so \\boxed{{\\frac{{{i}}}{{{i + 1}}}}}", f"{i / (i + 1)}"),
    lambda i: (f"\\boxed{{x^2+{2 * i}x+{i * i}}}", f"(x+{i})^2"),
    lambda i: (f"\\boxed{{\\sqrt{{{4 * i * i}}}}}", f"{2 * i}"),
    lambda i: (f"I think it's {i} apples", f"{i}"),
    lambda i: (f"\\boxed{{{i}}}", f"{i + 1}"),
    lambda i: (f"The answer is $\\frac{{{i}}}{{2}}\\pi$.", f"{i}\\pi/2"),
]
CODE = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
TESTS = [{"input": "2 3\n", "output": "5\n"}]


def rate(n: int, fn, *args) -> float:
    """Calls per second of ``fn(*args)``, which makes ``n`` calls."""
    t0 = time.perf_counter()
    fn(*args)
    return n / (time.perf_counter() - t0)


def through_service(service: RewardService, items: list[tuple[dict, str]]) -> None:
    async def go():
        await asyncio.gather(*(service.ascore(item, text) for item, text in items))

    asyncio.run(go())


def bench_math(n: int, workers: int) -> None:
    warm = ("\\boxed{x^2+2x+1}", "(x+1)^2")  # goes through sympy, whose first call is slow
    math_reward("q", warm[0], answer=warm[1])
    pairs = [MATH_MIX[i % len(MATH_MIX)](i + 2) for i in range(n)]
    inproc = rate(n, lambda: [math_reward("q", c, answer=g) for c, g in pairs])
    print(f"math  in-process (1 thread):          {inproc:8.0f} calls/s")
    service = RewardService(math_reward, workers=workers, timeout_s=30)
    try:
        through_service(service, [({"question": "q", "answer": warm[1]}, warm[0])] * workers)  # start, warm up
        items = [({"question": "q", "answer": g, "id": i}, c) for i, (c, g) in enumerate(pairs)]
        per_s = rate(n, through_service, service, items)
        print(f"math  service, {workers} workers:            {per_s:8.0f} calls/s")
    finally:
        service.close()


def bench_code(n: int, workers: int) -> None:
    for mechanism in MECHANISMS:
        box = probe(mechanism, default_python()) if available(mechanism) else None
        if box is None:
            print(f"code  {mechanism:8s} not available here")
            continue
        kw = dict(tests=TESTS, cpu_s=2.0, sandbox=mechanism)
        assert code_reward("q", CODE, **kw) == 1.0
        serial = rate(n, lambda kw: [code_reward("q", CODE, **kw) for _ in range(n)], kw)
        print(f"code  {box.description:28s} serial:   {serial:6.1f} executions/s ({1000 / serial:.0f} ms each)")
        service = RewardService(
            BoundReward(code_reward, {"cpu_s": 2.0, "sandbox": mechanism}), workers=workers, timeout_s=60
        )
        try:
            items = [({"question": "q", "tests": TESTS, "id": i}, CODE) for i in range(n)]
            through_service(service, items[:workers])
            per_s = rate(n, through_service, service, items)
            print(f"code  {box.description:28s} {workers} workers: {per_s:6.1f} executions/s")
        finally:
            service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--math", type=int, default=400, help="math calls")
    parser.add_argument("--code", type=int, default=40, help="code executions per mechanism")
    parser.add_argument("--workers", type=int, default=2, help="reward worker processes")
    args = parser.parse_args()
    print(f"isolation: {', '.join(m for m in MECHANISMS if available(m)) or 'none'} present; limits {Limits()}")
    bench_math(args.math, args.workers)
    bench_code(args.code, args.workers)


if __name__ == "__main__":
    main()
