"""Reward functions referenced by import path from tests."""


def digit_count_reward(prompt, completion, **_):
    """Rewards completions with more digits: varies even for a random model, so advantages are non-zero."""
    return float(sum(ch.isdigit() for ch in completion)) / 10.0


def raising_reward(prompt, completion, **_):
    raise RuntimeError("this reward always fails")


def constant_reward(prompt, completion, **_):
    """The same reward for every sample: no learning signal under a group baseline."""
    return 0.0


def huge_reward(prompt, completion, **_):
    return 1e300
