"""The lookup task's tools and episode (asyncrl.agent.tasks.lookup): the lookup tool is deterministic and forgiving of
spelling, simulated tool latency is log-normal, a perfect agent solves every problem and a guesser fails, the turn
limit and the python tool."""

import asyncio
import json
import random
import re
import statistics

import pytest

from asyncrl.agent.tasks import lookup
from asyncrl.data import lookup as lookup_task
from asyncrl.data.lookup import LookupTask, tool_call_text

from engines_for_tests import assistant_texts, play_lookup


def test_lookup_tool_is_deterministic_and_forgiving_of_spelling():
    item = LookupTask().split(1, 1)[0]
    key, value = next(iter(item["facts"].items()))
    thing, name = key.split(" of ")
    result = f"{name}: {value}"  # the box and its number, as the reference transcripts show it
    assert re.fullmatch(r"box [1-9]\d: \d+", result)  # two-digit boxes
    assert lookup.lookup(item, key) == result
    assert lookup.lookup(item, "  " + key.upper() + " ") == result
    assert lookup.lookup(item, f"{name}'s {thing}") == lookup.lookup(item, f"{name} {thing}") == result
    assert lookup.lookup(item, name) == lookup.lookup(item, name.upper()) == result  # the box alone
    assert lookup.lookup(item, f"{'cups' if thing != 'cups' else 'hats'} of {name}").startswith("no value")
    assert lookup.lookup(item, "Nobody apples").startswith("no value")
    assert lookup.lookup(item, None).startswith("error")
    assert asyncio.run(lookup.call_tool(item, "lookup", json.dumps({"key": key}))) == result
    assert asyncio.run(lookup.call_tool(item, "lookup", "{not json")).startswith("error")
    assert asyncio.run(lookup.call_tool(item, "search", "{}")).startswith("error: no tool")
    assert asyncio.run(lookup.call_tool(item, "python", '{"code": "print(1)"}', python=False)).startswith("error")


def test_latency_is_log_normal_with_the_given_median_and_p99():
    lat = lookup.Latency(0.1, 0.5, random.Random(0))
    xs = sorted(lat.sample() for _ in range(20000))
    assert statistics.median(xs) == pytest.approx(0.1, rel=0.05)
    assert xs[int(0.99 * len(xs))] == pytest.approx(0.5, rel=0.1)
    assert lookup.Latency().sample() == 0.0 and lookup.Latency(0.2).sample() == pytest.approx(0.2)


# ---- episodes ----------------------------------------------------------------------------------------------
def test_a_perfect_agent_solves_every_problem_and_a_guesser_fails(agent_tokenizer):
    items = LookupTask().split(10_000, 40)
    assert all(play_lookup(agent_tokenizer, it, assistant_texts(it))[0] == 1.0 for it in items)
    guesses = [play_lookup(agent_tokenizer, it, ["The answer is 50."])[0] for it in items]
    assert sum(guesses) <= 2
    # skipping a lookup and making the number up fails too
    it = next(it for it in items if len(it["facts"]) >= 2 and it["given"] is None)
    first_key, first = next(iter(it["facts"].items()))
    values = list(it["facts"].values())
    made_up = lookup_task.working([first, values[1] + 1] + values[2:], list(it["ops"]))
    assert play_lookup(agent_tokenizer, it, [tool_call_text("lookup", {"key": first_key}), made_up])[0] == 0.0


def test_turn_limit_and_python_tool(agent_tokenizer):
    item = LookupTask(python_frac=1.0).split(5, 20)
    item = next(it for it in item if any("python" in t for t in assistant_texts(it)))
    reward, recorded = play_lookup(agent_tokenizer, item, assistant_texts(item))  # runs the code in the sandbox
    assert reward == 1.0 and len(recorded.calls) == len(item["facts"]) + 2
    key = next(iter(item["facts"]))
    reward, recorded = play_lookup(agent_tokenizer, item, [tool_call_text("lookup", {"key": key})] * 3, max_turns=3)
    assert reward == 0.0 and len(recorded.calls) == 3
