"""Reward functions that misbehave on purpose, referenced by import path from the reward-service tests."""

import math
import os
import time


def exact_answer(prompt, completion, answer="", **_):
    return float(completion.strip() == str(answer))


def raising(prompt, completion, **_):
    raise RuntimeError("this reward always fails")


def hanging(prompt, completion, **_):
    time.sleep(3600)
    return 1.0


def hangs_on_even_ids(prompt, completion, id=None, **_):
    """Hangs for every other training sample (held-out items have no id), scores the rest: training must go
    on with half its rewards."""
    if id is not None and id % 2 == 0:
        time.sleep(3600)
    return float(len(completion) % 2)


def kills_its_worker(prompt, completion, **_):
    os._exit(3)


def not_a_number(prompt, completion, **_):
    return math.nan


def scaled(prompt, completion, answer="", scale=1.0, **_):
    return scale * float(completion.strip() == str(answer))


def pid(prompt, completion, **_):
    return float(os.getpid())
