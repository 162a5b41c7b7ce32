"""The built-in arithmetic task (asyncrl.data.arith): right labels for every operator, too few distinct problems an
error and not a hang, and the default task unchanged."""

import itertools
import re

import pytest

from asyncrl.configlib import ConfigError
from asyncrl.data.arith import ArithTask, arith_reward
from asyncrl.data.config import TaskConfig

from datasets_for_tests import build, take


def test_every_allowed_operator_gives_right_labels():
    task = ArithTask(min_terms=2, max_terms=6, ops="+-*")
    for item in itertools.islice(task.stream(3), 300):
        expression = item["question"].removeprefix("Compute ").removesuffix(".")
        value = int(expression.split()[0])
        for op, operand in re.findall(r"([-+*]) (\d+)", expression):  # left to right, as the steps are written
            value = {"+": value + int(operand), "-": value - int(operand), "*": value * int(operand)}[op]
        assert str(value) == item["answer"], item


def test_too_few_distinct_problems_is_an_error_not_a_hang():
    tiny = TaskConfig(min_terms=2, max_terms=2, max_operand=2, ops="+")  # 2 + 1 and 2 + 2 only
    with pytest.raises(
        ConfigError,
        match=r"valid_dataset.size=200: task 'arith': its options allow only about 2 "
        "distinct problems, fewer than 200",
    ):
        build(task=tiny, valid_size=200)
    with pytest.raises(ConfigError, match="problems in a row were held-out ones"):
        build(task=tiny, valid_size=2)  # both held out: nothing left to train on
    assert len(build(task=tiny, valid_size=1).valid) == 1


def test_builtin_task_is_unchanged_by_default():
    data = build(valid_size=4)
    task = ArithTask()
    held = task.split(10_000, 4)
    questions = {it["question"] for it in held}
    expected = take((it for it in task.stream(0) if it["question"] not in questions), 5)
    assert data.valid == held and data.reward_fn is arith_reward
    assert take(data.train, 5) == [{**it, "id": i} for i, it in enumerate(expected)]


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("The answer is 6.", 1.0),
        ("The answer is -6", 0.0),
        ("The answer is 6.5.", 0.0),
        ("The answer is 6,5", 0.0),
        ("The answer is 60.", 0.0),
        ("answer is 5. The answer is 6", 1.0),
    ],
)
def test_the_answer_is_an_integer(completion, reward):
    assert arith_reward("Compute 3 + 3.", completion, "6") == reward
