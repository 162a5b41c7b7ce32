"""A fresh task of a user's own, end to end: data -> ``asyncrl sft`` from builtin:tiny-sft -> ``asyncrl train``
with the task's reward -> held-out accuracy over time. Run by hand (minutes), one task per call:

    python bench/own_task.py --task vowels --out outputs/own-vowels
    python bench/own_task.py --task first --out outputs/own-first --rl actor.lr=2e-4

Invented tasks of different kinds (nothing in asyncrl knows them). Two with answers from a small set, which a
guesser often gets right:
- ``vowels``: "How many vowels are in the word 'tobarine'?" -> ``4`` (counting letters of a made-up word);
- ``first``: "Which letter comes first in the alphabet: k, d, r?" -> ``d`` (ordering);
five whose answers a guess seldom hits:
- ``reverse``: "Write the word 'tobarine' backwards." -> ``eniarbot`` (rewriting a made-up word);
- ``digitsum``: "What is the sum of the digits of 4725?" -> ``18`` (adding, 3 or 4 digits);
- ``initials``: "Write the first letter of each word: tobar kelime sunopa" -> ``tks`` (picking letters out);
- ``next``: "What number comes next: 27, 30, 33, 36?" -> ``39`` (finding a pattern, then applying it);
- ``story``: "Ana has 7 shells, finds 5 more and gives away 3. How many shells does Ana have now?" -> ``9``
  (reading which numbers to add and which to take away);
and two where a guess hits now and then:
- ``largest``: "Which number is the largest: 58, 36, 72, 13?" -> ``72`` (comparing, keeping the larger);
- ``maxdigit``: "What is the largest digit of 3416270?" -> ``7`` (the same, over the digits of one number).
Rows are ``{"question", "answer"}``; SFT trains on the bare answer, as a user's file of short answers would
(``--working``: on the steps, then ``The answer is X.``). ``--sft-rows N`` gives SFT the first N rows only, the
case RL is for: few demonstrations, many questions whose answers can be checked.
``--rl`` and ``--sft`` add overrides to the RL and SFT commands; ``--rl-from DIR`` starts RL from another model
(a longer SFT). docs/your-task.md "RL lifts a fresh task" has the commands that took ``digitsum`` from its
SFT plateau (0.425) to 0.740 held-out with RL.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from pathlib import Path

VOWELS = "aeiou"
CONSONANTS = "bcdfghklmnprstvz"


def made_up_word(rng: random.Random) -> str:
    """A pronounceable made-up word of 2 to 4 syllables: 0-2 consonants, 1-2 vowels, sometimes a closing
    consonant (so its vowels are not simply its syllables)."""
    parts = []
    for _ in range(rng.randint(2, 4)):
        onset = "".join(rng.choice(CONSONANTS) for _ in range(rng.choice((0, 1, 1, 2))))
        nucleus = "".join(rng.choice(VOWELS) for _ in range(rng.choice((1, 1, 2))))
        parts.append(onset + nucleus + (rng.choice(CONSONANTS) if rng.random() < 0.3 else ""))
    return "".join(parts)


def vowels_row(rng: random.Random) -> dict:
    word = made_up_word(rng)
    vowels = [c for c in word if c in VOWELS]
    return {
        "question": f"How many vowels are in the word '{word}'?",
        "answer": str(len(vowels)),
        "working": f"The vowels are {', '.join(vowels)}. The answer is {len(vowels)}.",
    }


def first_row(rng: random.Random) -> dict:
    letters = rng.sample("abcdefghijklmnopqrstuvwxyz", rng.randint(3, 5))
    order = sorted(letters)
    return {
        "question": f"Which letter comes first in the alphabet: {', '.join(letters)}?",
        "answer": order[0],
        "working": f"In order: {', '.join(order)}. The answer is {order[0]}.",
    }


def reverse_row(rng: random.Random) -> dict:
    word = made_up_word(rng)
    return {
        "question": f"Write the word '{word}' backwards.",
        "answer": word[::-1],
        "working": f"The letters from the end: {', '.join(word[::-1])}. The answer is {word[::-1]}.",
    }


def digitsum_row(rng: random.Random) -> dict:
    digits = [rng.randint(1, 9)] + [rng.randint(0, 9) for _ in range(rng.randint(2, 3))]
    sums = [sum(digits[: i + 1]) for i in range(len(digits))]
    steps = ", ".join(f"{a} + {d} = {s}" for a, d, s in zip(sums, digits[1:], sums[1:]))
    return {
        "question": f"What is the sum of the digits of {''.join(map(str, digits))}?",
        "answer": str(sums[-1]),
        "working": f"{steps}. The answer is {sums[-1]}.",
    }


def initials_row(rng: random.Random) -> dict:
    words = [made_up_word(rng) for _ in range(rng.randint(3, 5))]
    letters = [w[0] for w in words]
    return {
        "question": f"Write the first letter of each word: {' '.join(words)}",
        "answer": "".join(letters),
        "working": f"The first letters: {', '.join(letters)}. The answer is {''.join(letters)}.",
    }


def next_row(rng: random.Random) -> dict:
    start, step = rng.randint(1, 99), rng.randint(2, 19)
    terms = [start + i * step for i in range(4)]
    return {
        "question": f"What number comes next: {', '.join(map(str, terms))}?",
        "answer": str(terms[-1] + step),
        "working": f"{terms[1]} - {terms[0]} = {step}, {terms[-1]} + {step} = {terms[-1] + step}. "
        f"The answer is {terms[-1] + step}.",
    }


NAMES = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
THINGS = ("shells", "coins", "stamps", "apples", "marbles", "cards", "pens", "books")


def story_row(rng: random.Random) -> dict:
    name, things = rng.choice(NAMES), rng.choice(THINGS)
    start, gain = rng.randint(2, 20), rng.randint(2, 20)
    loss = rng.randint(1, start + gain - 1)
    if rng.random() < 0.5:
        text, first = f"{name} has {start} {things}, finds {gain} more and gives away {loss}.", "+"
        mid = start + gain
    else:
        start = max(start, loss + 1)
        text, first = f"{name} has {start} {things}, gives away {loss} and finds {gain} more.", "-"
        mid = start - loss
    end = mid - loss if first == "+" else mid + gain
    steps = (
        f"{start} + {gain} = {mid}, {mid} - {loss} = {end}"
        if first == "+"
        else f"{start} - {loss} = {mid}, {mid} + {gain} = {end}"
    )
    return {
        "question": f"{text} How many {things} does {name} have now?",
        "answer": str(end),
        "working": f"{steps}. The answer is {end}.",
    }


def running_max(values: list[int]) -> tuple[int, str]:
    """The largest value and the working that finds it: each value compared with the largest so far."""
    best, steps = values[0], []
    for v in values[1:]:
        steps.append(f"{best} {'<' if best < v else '>' if best > v else '='} {v}")
        best = max(best, v)
    return best, f"{', '.join(steps)}. The answer is {best}."


def largest_row(rng: random.Random) -> dict:
    numbers = rng.sample(range(10, 100), rng.randint(3, 5))
    best, working = running_max(numbers)
    return {
        "question": f"Which number is the largest: {', '.join(map(str, numbers))}?",
        "answer": str(best),
        "working": working,
    }


def maxdigit_row(rng: random.Random) -> dict:
    # the answer first, uniform over 4-9 (with digits drawn uniformly, 9 would be the answer more than half the
    # time and a constant guess would score like a model), then 6-9 digits up to it, holding it at least once
    top = rng.randint(4, 9)
    digits = [rng.randint(0, top) for _ in range(rng.randint(6, 9))]
    digits[rng.randrange(len(digits))] = top
    digits[0] = digits[0] or rng.randint(1, top)
    best, working = running_max(digits)
    return {
        "question": f"What is the largest digit of {''.join(map(str, digits))}?",
        "answer": str(best),
        "working": working,
    }


TASKS = {
    "vowels": vowels_row,
    "first": first_row,
    "reverse": reverse_row,
    "digitsum": digitsum_row,
    "initials": initials_row,
    "next": next_row,
    "story": story_row,
    "largest": largest_row,
    "maxdigit": maxdigit_row,
}
# added later: their token budgets come from their rows
NEW = ("reverse", "digitsum", "initials", "next", "story", "largest", "maxdigit")


def reward(prompt: str, completion: str, answer: str, **_) -> float:
    """1.0 when the completion's answer is right: what follows its last ``answer is``, else its first word
    (``4``, ``4.``, ``d`` and ``d.`` all count)."""
    tail = completion.rsplit("answer is", 1)[-1]
    found = re.findall(r"[A-Za-z0-9]+", tail)
    return float(bool(found) and found[0].lower() == answer.lower())


def strict_reward(prompt: str, completion: str, answer: str, solution: str = "", **_) -> float:
    """1.0 only when the working is right too: the completion's steps before ``The answer is`` equal the
    reference's (``--working`` rows carry them as ``solution``) and so does the answer. With answers from a small
    set (a count of 1-5), a right answer alone is often a lucky guess; this rewards the way to it."""
    if not solution:
        raise ValueError("strict_reward needs the rows' solution column (make the data with --working)")
    steps = completion.rsplit("The answer is", 1)[0].strip()
    return float(reward(prompt, completion, answer) == 1.0 and steps == solution.rsplit("The answer is", 1)[0].strip())


def _steps(text: str) -> list[str]:
    """The working's steps: what precedes ``The answer is``, split at commas (``4 + 7 = 11``, or one letter)."""
    body = text.rsplit("The answer is", 1)[0].strip().rstrip(".")
    return [s.strip() for s in body.split(",") if s.strip()]


def steps_reward(prompt: str, completion: str, answer: str, solution: str = "", **_) -> float:
    """Partial credit for the way to the answer: the share of the reference's steps the completion writes right
    before its first wrong one, the answer counting as one more step only after all of them. A lucky answer
    after wrong working earns only the steps before the mistake; 1.0 exactly when ``strict_reward`` gives 1.0
    (a denser signal than it: groups whose eight samples are all wrong still rank how far each got)."""
    if not solution:
        raise ValueError("steps_reward needs the rows' solution column (make the data with --working)")
    ref, got = _steps(solution), _steps(completion)
    right = 0
    for a, b in zip(ref, got):
        if a != b:
            break
        right += 1
    done = right == len(ref) == len(got) and reward(prompt, completion, answer) == 1.0
    return (right + done) / (len(ref) + 1)


def make_data(
    task: str, out: Path, n_train: int = 4000, n_test: int = 200, seed: int = 0, working: bool = False
) -> tuple[Path, Path]:
    """Rows of ``question`` and ``answer``; with ``working``, also a ``solution`` that writes the steps before the
    answer (the SFT target)."""
    rng, make = random.Random(seed), TASKS[task]
    test, seen = [], set()
    while len(test) < n_test:
        r = make(rng)
        if r["question"] not in seen:
            seen.add(r["question"])
            test.append(r)
    train = []
    while len(train) < n_train:
        r = make(rng)
        if r["question"] not in seen:
            train.append(r)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        rows = [
            {"question": r["question"], "answer": r["answer"], **({"solution": r["working"]} if working else {})}
            for r in rows
        ]
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out / "train.jsonl", out / "test.jsonl"


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def accuracies(path: Path, key: str = "eval_accuracy") -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["step"], r.get("elapsed_s", 0.0), r[key]) for r in rows if isinstance(r.get(key), (int, float))]


def verified_rows(samples: Path, per_question: int = 2) -> list[dict]:
    """Rows of SFT data made from ``asyncrl eval`` output: up to ``per_question`` distinct completions the
    reward scored right, each with its question and answer."""
    rows = []
    for line in samples.read_text().splitlines():
        r = json.loads(line)
        right = dict.fromkeys(c for c, reward in zip(r["completions"], r["rewards"]) if reward >= 1.0)
        rows += [{"question": r["question"], "answer": r["answer"], "solution": c} for c in list(right)[:per_question]]
    return rows


def sample_answers(
    args, asyncrl: list[str], fn: str, train: Path, tokens: list[str], model: Path, n: int, out: Path
) -> Path:
    """Eight sampled answers of ``model`` to each of ``n`` training questions the demonstrations do not hold
    (``asyncrl eval`` output rows: question, answer, completions, rewards)."""
    out.mkdir(parents=True, exist_ok=True)
    pool, samples = out / "questions.jsonl", out / "samples.jsonl"
    pool.write_text("".join(train.read_text().splitlines(keepends=True)[args.sft_rows : args.sft_rows + n]))
    run(
        asyncrl
        + [
            "eval",
            "--model",
            str(model),
            f"valid_dataset.path={pool}",
            f"valid_dataset.size={n}",
            fn,
            "gconfig.n_samples=8",
            "evaluator.greedy=false",
            "k=[1,8]",
            *tokens,
            f"output={samples}",
        ]
    )
    return samples


def check_stats(rows: list[dict], solutions: dict[str, str]) -> dict:
    """What the check before RL reads from sampled answers: how often a sample passes (pass@1) and a question has
    a passing sample (pass@8); how often a sample passes with every step of the working right (``strict_reward``),
    and that as a share of the passes (low: the reward mostly pays luck); the share of groups with a signal
    (neither all right nor all wrong)."""
    samples = passed = strict = hit = signal = 0
    for r in rows:
        solution = solutions[r["question"]]
        right = [reward >= 1.0 for reward in r["rewards"]]
        samples += len(right)
        passed += sum(right)
        strict += sum(strict_reward(r["question"], c, r["answer"], solution) for c in r["completions"])
        hit += any(right)
        signal += 0 < sum(right) < len(right)
    return {
        "questions": len(rows),
        "pass@1": passed / samples,
        "pass@8": hit / len(rows),
        "right working": strict / samples,
        "right working of passes": strict / max(passed, 1),
        "groups with signal": signal / len(rows),
    }


def check(args, asyncrl: list[str], fn: str, train: Path, tokens: list[str]) -> None:
    """Step 2 of docs/your-task.md's recipe, before RL: sample the model RL would start from and print what the
    reward pays for."""
    model = Path(args.rl_from or args.out / "sft")
    samples = sample_answers(args, asyncrl, fn, train, tokens, model, args.check, args.out / "check" / model.name)
    solutions = {r["question"]: r["solution"] for r in map(json.loads, train.read_text().splitlines())}
    stats = check_stats([json.loads(line) for line in samples.read_text().splitlines()], solutions)
    print(
        f"{args.task}: {model}: "
        + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())
    )


def self_distill(args, asyncrl: list[str], fn: str, train: Path, test: Path, demos: Path, tokens: list[str]) -> None:
    """The verifier without RL: sample 8 answers to each of ``--distill`` training questions the demonstrations
    do not hold, keep the right ones, and fine-tune the SFT model on them with the demonstrations; beside it,
    the same steps of SFT on the demonstrations alone (the control)."""
    out = args.out / "distill"
    kept = verified_rows(sample_answers(args, asyncrl, fn, train, tokens, args.out / "sft", args.distill, out))
    data = out / "train.jsonl"
    data.write_text(demos.read_text() + "".join(json.dumps(r) + "\n" for r in kept))
    print(f"kept {len(kept)} verified answers to {len({r['question'] for r in kept})} of {args.distill} questions")
    for name, rows in (("verified", data), ("demos-only", demos)):
        run(
            asyncrl
            + [
                "sft",
                f"model.path={args.out / 'sft'}",
                f"train_dataset.path={rows}",
                f"valid_dataset.path={test}",
                fn,
                f"total_train_steps={args.sft_steps}",
                "evaluator.freq_steps=20",
                *tokens,
                f"output_dir={out / name}",
            ]
        )
        acc = accuracies(out / name / "sft_metrics.jsonl")
        print(f"{args.task}: SFT on {name} rows, held-out by step: " + ", ".join(f"{s}:{a:.3f}" for s, _, a in acc))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument(
        "--sft-rows",
        type=int,
        default=0,
        help="SFT on the first N rows only (few demonstrations, many questions to verify); 0: all",
    )
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--rl-seconds", type=int, default=300)
    p.add_argument("--sft", nargs="*", default=[], help="extra overrides of asyncrl sft")
    p.add_argument("--rl", nargs="*", default=[], help="extra overrides of asyncrl train")
    p.add_argument("--skip-sft", action="store_true", help="reuse OUT/sft")
    p.add_argument("--name", default="run", help="the RL run's name: OUT/rl/NAME")
    p.add_argument("--rl-from", type=Path, default=None, help="the model RL starts from (default: OUT/sft)")
    p.add_argument("--working", action="store_true", help="SFT targets write the steps, then 'The answer is X.'")
    p.add_argument(
        "--distill",
        type=int,
        default=0,
        help="instead of RL: sample answers to N more questions, keep the right ones, SFT on them",
    )
    p.add_argument(
        "--check",
        type=int,
        default=0,
        help="instead of RL: sample 8 answers of the model RL would start from (--rl-from, else OUT/sft) "
        "to N more questions and print what the reward pays for (docs/your-task.md, step 2)",
    )
    args = p.parse_args(argv)
    from machine import cpu  # bench/ is on the path of a script run from it (not of the reward's importers)

    print(cpu())
    train, test = make_data(args.task, args.out / "data", args.rows, working=args.working)
    # room for the longest target (its characters bound its tokens); vowels and first keep the budgets their
    # documented rows were measured with (SFT 8 or 32, RL the default)
    longest = max(len(json.loads(line)["solution" if args.working else "answer"]) for line in open(train))
    sft_tokens = [f"gconfig.max_new_tokens={longest + 8 if args.task in NEW else 32 if args.working else 8}"]
    rl_tokens = sft_tokens if args.task in NEW else []
    asyncrl = [sys.executable, "-m", "asyncrl.cli"]
    fn = "reward.fn=bench.own_task:reward"
    demos = train
    if args.sft_rows:
        demos = args.out / "data" / f"train-{args.sft_rows}.jsonl"
        demos.write_text("".join(train.read_text().splitlines(keepends=True)[: args.sft_rows]))
    if not args.skip_sft:
        run(
            asyncrl
            + [
                "sft",
                "model.path=builtin:tiny-sft",
                f"train_dataset.path={demos}",
                f"valid_dataset.path={test}",
                fn,
                f"total_train_steps={args.sft_steps}",
                "evaluator.freq_steps=50",
                *sft_tokens,
                f"output_dir={args.out / 'sft'}",
                *args.sft,
            ]
        )
    if args.distill:
        self_distill(args, asyncrl, fn, train, test, demos, sft_tokens)
        return 0
    if args.check:
        if not args.working:
            raise SystemExit("--check reads the working: make the data with --working")
        check(args, asyncrl, fn, train, sft_tokens)
        return 0
    run(
        asyncrl
        + [
            "train",
            f"model.path={args.rl_from or args.out / 'sft'}",
            f"train_dataset.path={train}",
            f"valid_dataset.path={test}",
            fn,
            f"max_train_time_s={args.rl_seconds}",
            "total_train_steps=100000",
            "evaluator.freq_steps=10",
            f"output_dir={args.out}",
            "experiment_name=rl",
            f"trial_name={args.name}",
            "resume=fresh",
            "progress_bar=false",
            *rl_tokens,
            *args.rl,
        ]
    )
    sft = accuracies(args.out / "sft" / "sft_metrics.jsonl")
    rl = accuracies(args.out / "rl" / args.name / "metrics.jsonl")
    print(f"\n{args.task}: SFT held-out accuracy by step: " + ", ".join(f"{s}:{a:.3f}" for s, _, a in sft))
    print(
        f"{args.task}: RL held-out accuracy by step (elapsed s): "
        + ", ".join(f"{s}({t:.0f}):{a:.3f}" for s, t, a in rl)
    )
    if rl:
        last = [a for _, _, a in rl[-3:]]
        print(
            f"{args.task}: RL start {rl[0][2]:.3f} -> end {rl[-1][2]:.3f} (mean of the last 3: "
            f"{sum(last) / len(last):.3f}), {rl[-1][0]} steps"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
