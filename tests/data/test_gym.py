"""reasoning-gym tasks as datasets (asyncrl.data.gym): by name, and prompt templates that keep held-out questions out
of training."""

import pytest

from asyncrl.configlib import ConfigError
from asyncrl.reward import call_reward

from datasets_for_tests import build, take


def test_reasoning_gym_task_by_name():
    pytest.importorskip("reasoning_gym")
    data = build("gym:chain_sum", valid_size=20, gym_options={"min_terms": 2, "max_terms": 3})
    held = {it["question"] for it in data.valid}
    items = take(data.train, 50)
    assert len(held) == 20 and not held & {it["question"] for it in items}
    it = items[0]
    assert it["gym_task"] == "chain_sum" and data.reward_fn.__name__ == "gym_reward"
    assert call_reward(data.reward_fn, it, f"<answer>{it['answer']}</answer>") == 1.0
    assert call_reward(data.reward_fn, it, "The answer is 1e9.") < 1.0
    with pytest.raises(ConfigError, match="no task 'chain_summ'.*chain_sum"):
        build("gym:chain_summ")


GYM_TINY = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # few distinct questions


def test_gym_prompt_template_keeps_held_out_questions_out_of_training():
    """The held-out exclusion compares the same (untemplated) questions the generator makes: with a template,
    held-out problems must still never be trained on."""
    pytest.importorskip("reasoning_gym")
    template = "{question}\nGive the result in <answer></answer> tags."
    data = build("gym:chain_sum", valid_size=40, gym_options=GYM_TINY, prompt_template=template)
    held = {it["question"] for it in data.valid}
    trained = {it["question"] for it in take(data.train, 400)}
    assert all(q.endswith("<answer></answer> tags.") for q in held | trained)
    assert not held & trained
    raw = build("gym:chain_sum", valid_size=40, gym_options=GYM_TINY)  # the same problems, untemplated
    assert {template.format(**it) for it in raw.valid} == held


def test_gym_prompt_template_with_an_unknown_field_names_the_key():
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ConfigError, match=r"train_dataset.prompt_template.*'problem'"):
        build("gym:chain_sum", valid_size=5, gym_options=GYM_TINY, prompt_template="{problem} Answer it.")
    with pytest.raises(ConfigError, match="train_dataset.prompt_template"):
        build("gym:chain_sum", valid_size=5, gym_options=GYM_TINY, prompt_template="{question")
