"""bench/own_task.py's invented tasks and rewards, which docs/your-task.md's measurements rest on: the data keeps
held-out questions out of training, and the rewards that check the working cannot be earned by a lucky answer."""

from __future__ import annotations

import json

import pytest

from bench import own_task
from bench.own_task import reward, steps_reward, strict_reward

SOLUTION = "4 + 7 = 11, 11 + 2 = 13. The answer is 13."


@pytest.mark.parametrize("task", sorted(own_task.TASKS))
def test_every_task_makes_disjoint_train_and_test_rows_whose_working_ends_in_the_answer(task, tmp_path):
    train, test = own_task.make_data(task, tmp_path, n_train=300, n_test=50, working=True)
    rows = {
        name: [json.loads(line) for line in path.read_text().splitlines()]
        for name, path in (("train", train), ("test", test))
    }
    assert len(rows["train"]) == 300 and len(rows["test"]) == 50
    assert not {r["question"] for r in rows["train"]} & {r["question"] for r in rows["test"]}
    for r in rows["train"] + rows["test"]:
        assert r["solution"].endswith(f"The answer is {r['answer']}.")
        assert reward(r["question"], r["solution"], r["answer"]) == 1.0
        assert strict_reward(r["question"], r["solution"], r["answer"], r["solution"]) == 1.0
        assert steps_reward(r["question"], r["solution"], r["answer"], r["solution"]) == 1.0


def test_the_next_task_continues_an_arithmetic_sequence(tmp_path):
    train, _ = own_task.make_data("next", tmp_path, n_train=50, n_test=10)
    for r in map(json.loads, train.read_text().splitlines()):
        terms = [int(t) for t in r["question"].split(":")[1].strip(" ?").split(", ")]
        assert len({b - a for a, b in zip(terms, terms[1:])}) == 1
        assert int(r["answer"]) == 2 * terms[-1] - terms[-2]


def test_the_comparing_tasks_answer_the_largest_and_maxdigit_does_not_favour_nine(tmp_path):
    train, _ = own_task.make_data("largest", tmp_path / "largest", n_train=50, n_test=10)
    for r in map(json.loads, train.read_text().splitlines()):
        assert int(r["answer"]) == max(int(n) for n in r["question"].split(":")[1].strip(" ?").split(", "))
    train, _ = own_task.make_data("maxdigit", tmp_path / "maxdigit", n_train=600, n_test=10)
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    for r in rows:
        number = r["question"].rsplit(" ", 1)[1].rstrip("?")
        assert number[0] != "0" and r["answer"] == max(number)
    assert max(sum(r["answer"] == d for r in rows) for d in "456789") < 0.25 * len(rows)  # uniform: ~1/6 each


def test_the_check_before_rl_tells_passes_from_passes_with_the_right_working():
    rows = [
        {
            "question": "q1",
            "answer": "13",
            "rewards": [1.0, 1.0, 0.0, 0.0],
            "completions": [SOLUTION, "4 + 7 = 11, 10 + 3 = 13. The answer is 13.", "x", "y"],
        },
        {"question": "q2", "answer": "13", "rewards": [0.0] * 4, "completions": ["x"] * 4},
    ]
    stats = own_task.check_stats(rows, {"q1": SOLUTION, "q2": SOLUTION})
    assert stats == {
        "questions": 2,
        "pass@1": 2 / 8,
        "pass@8": 0.5,
        "right working": 1 / 8,
        "right working of passes": 0.5,
        "groups with signal": 0.5,
    }


@pytest.mark.parametrize(
    "completion, answer_only, strict, steps",
    [
        (SOLUTION, 1.0, 1.0, 1.0),
        ("4 + 7 = 11, 10 + 3 = 13. The answer is 13.", 1.0, 0.0, 1 / 3),  # a lucky answer after a wrong step
        ("4 + 7 = 11, 11 + 2 = 13. The answer is 14.", 0.0, 0.0, 2 / 3),  # right working, wrong answer
        ("4 + 7 = 11, 11 + 2 = 13, 13 + 1 = 14. The answer is 14.", 0.0, 0.0, 2 / 3),  # a step too many
        ("3 + 7 = 10. The answer is 13.", 1.0, 0.0, 0.0),
        ("", 0.0, 0.0, 0.0),
    ],
)
def test_only_the_working_rewards_tell_a_lucky_answer_from_a_right_one(completion, answer_only, strict, steps):
    assert reward("", completion, "13") == answer_only
    assert strict_reward("", completion, "13", SOLUTION) == strict
    assert steps_reward("", completion, "13", SOLUTION) == pytest.approx(steps)


def test_the_working_rewards_need_the_solution_column():
    with pytest.raises(ValueError, match="solution"):
        steps_reward("", SOLUTION, "13")
