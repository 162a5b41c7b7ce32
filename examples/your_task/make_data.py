"""Make the data of the walk-through task in docs/your-task.md: sort a few words alphabetically.

    python examples/your_task/make_data.py --out outputs/sort-data

writes three files of prompt + answer rows, e.g. ``{"prompt": "Sort alphabetically: pear fig apple",
"answer": "apple fig pear"}``: ``sft.jsonl``, demonstrations of short lists (3 or 4 words; the answer is the
SFT target), ``train.jsonl``, RL prompts of 3 to 5 words (the answer is only used by the reward), and
``test.jsonl``, held-out prompts of 3 to 5 words that neither of the others repeats. The demonstrations cover
the easy cases only, and a share of them (``--careless``, half by default) are wrong: they repeat the words in
the order given, as a careless annotator would. SFT learns the mistakes with the rest; RL with the reward,
on longer lists too, takes the model further. The task stands for any task of your own: a file of prompts
with reference answers, and a reward function (``reward.py`` beside this file) that scores a completion
against the row's fields.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

WORDS = (
    "apple",
    "bread",
    "cherry",
    "dune",
    "eagle",
    "fig",
    "grape",
    "harbor",
    "island",
    "jungle",
    "kettle",
    "lemon",
    "maple",
    "needle",
    "olive",
    "pepper",
    "quartz",
    "river",
    "salt",
    "tiger",
    "umbra",
    "violet",
    "walnut",
    "yarrow",
    "zebra",
    "plum",
    "pearl",
    "maze",
    "stone",
    "storm",
    "bright",
    "brook",
)


def row(rng: random.Random, min_words: int, max_words: int, careless: float = 0.0) -> dict:
    words = rng.sample(sorted(set(WORDS)), rng.randint(min_words, max_words))
    answer = words if rng.random() < careless else sorted(words)
    return {"prompt": "Sort alphabetically: " + " ".join(words), "answer": " ".join(answer)}


def make(n_sft: int, n_train: int, n_test: int, seed: int = 0, careless: float = 0.5) -> dict[str, list[dict]]:
    """Rows of the three files: ``n_test`` distinct held-out rows, and training rows that never repeat one."""
    rng = random.Random(seed)
    test, seen = [], set()
    while len(test) < n_test:
        r = row(rng, 3, 5)
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            test.append(r)

    def rows(n: int, max_words: int, careless: float = 0.0) -> list[dict]:
        out = []
        while len(out) < n:
            r = row(rng, 3, max_words, careless)
            if r["prompt"] not in seen:
                out.append(r)
        return out

    return {"sft.jsonl": rows(n_sft, 4, careless), "train.jsonl": rows(n_train, 5), "test.jsonl": test}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for train.jsonl and test.jsonl")
    p.add_argument("--sft", type=int, default=5_000, help="SFT demonstrations (3 or 4 words)")
    p.add_argument("--train", type=int, default=20_000, help="RL prompts")
    p.add_argument("--test", type=int, default=200, help="held-out rows")
    p.add_argument("--careless", type=float, default=0.5, help="share of SFT demonstrations left unsorted")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    files = make(args.sft, args.train, args.test, args.seed, args.careless)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(json.dumps({"out": str(out), **{name: len(rows) for name, rows in files.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
