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


def exits_once(prompt, completion, flag="", **_):
    """Kills its worker the first time (while the file ``flag`` exists), then scores 1.0."""
    if os.path.exists(flag):
        os.remove(flag)
        os._exit(3)
    return 1.0


def detaches_sleepers(prompt, completion, n=20, marker="0.1", hang=False, **_):
    """Starts ``n`` children that each leave the worker's session and process group (``os.setsid``) and sleep
    (``sleep 300 MARKER``: ``marker`` is a number unique to the test, found in their command lines); returns at
    once, or with ``hang`` never."""
    for _ in range(n):
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sleep", ["sleep", "300", marker])
    if hang:
        time.sleep(3600)
    return 1.0


def namespace_pid(prompt, completion, **_):
    """The worker's pid as it sees it (1 in a pid namespace of its own)."""
    return float(os.getpid())
