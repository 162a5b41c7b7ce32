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


def one_reward(prompt, completion, **_):
    """Always 1.0: tells apart which function scored a sample (with constant_reward's 0.0)."""
    return 1.0


def scale_reward(prompt, completion, scale=1.0, **_):
    """Returns its ``scale`` keyword: shows which kwargs were bound."""
    return float(scale)


def even_length_reward(prompt, completion, **_):
    """1.0 for a completion of an even number of characters: about half of a random model's samples, so
    pass@k and mean@n have successes and failures to count."""
    return float(len(completion) % 2 == 0)


def always_one_reward(prompt, completion, **fields):
    """1.0 for any completion of an item that reached the reward with its fields (the default verifier would
    score an untrained model's answers 0)."""
    return 1.0 if prompt and "answer" in fields else 0.0
