"""Agent evaluation (asyncrl.agent.tasks.evaluate): a failing episode scores 0, and the shipped builtin:tiny-agent,
greedy on held-out lookup problems through the in-process client, solves some but not all, looking up where its
demonstrations looked up and guessing where they guessed."""

import asyncio
import statistics
from pathlib import Path

import pytest

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.proxy import AgentProxy
from asyncrl.agent.tasks.evaluate import evaluate_agent, evaluate_episodes
from asyncrl.agent.tasks.lookup import episode
from asyncrl.agent.tasks.transcripts import assistant_ids
from asyncrl.data.lookup import LookupTask
from asyncrl.types import Completion, SamplingParams

from conftest import ROOT


def test_evaluate_episodes_scores_failures_as_zero(agent_tokenizer):
    renderer = ChatRenderer(agent_tokenizer, agent_tokenizer.eos_token_id)
    items = LookupTask().split(10_000, 6)

    class Engine:
        version = 0

        async def generate(self, prompt_ids, params):
            ids = assistant_ids(renderer, "The answer is 3.")
            return [Completion(list(prompt_ids), ids, [0.0] * len(ids), [0] * len(ids), "stop")]

    async def flaky(client, item):
        if item is items[0]:
            raise RuntimeError("boom")
        reply = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
        return 1.0 if "3" in reply.choices[0].message.content else 0.0

    proxy = AgentProxy(renderer, SamplingParams(stop_token_ids=(agent_tokenizer.eos_token_id,)), 512, engine=Engine())
    out = asyncio.run(evaluate_episodes(proxy, items, flaky))
    assert out["eval_accuracy"] == pytest.approx(5 / 6) and out["eval_episode_failures"] == 1
    assert out["eval_calls_mean"] == pytest.approx(5 / 6) and not proxy.episodes


# ---- the shipped checkpoint -------------------------------------------------------------------------------
def test_the_shipped_tiny_agent_looks_numbers_up_and_solves_some_held_out_problems():
    """builtin:tiny-agent, greedy, on 48 held-out problems of examples/agent_lookup.yaml's task through the
    in-process client: it solves some but not all; on questions about the things its demonstrations looked up it
    looks up (at least one lookup, right more often than not), and on the things they mostly guessed it guesses
    (what RL has to fix)."""
    import torch
    import yaml

    from asyncrl.engine.local import LocalEngine
    from asyncrl.models.hf import load_model, load_tokenizer, resolve_model_path

    torch.set_num_threads(2)
    try:
        path = resolve_model_path("builtin:tiny-agent")
    except FileNotFoundError:
        pytest.skip("builtin:tiny-agent is not shipped (README: reproducing the shipped checkpoints)")
    recipe = yaml.safe_load((Path(path) / "sft_config.yaml").read_text())["task"]
    guessed = set(recipe["direct_things"])
    task = yaml.safe_load((ROOT / "examples" / "agent_lookup.yaml").read_text())["task"]
    assert {k: task[k] for k in ("min_terms", "max_terms", "max_operand")} == {
        k: recipe[k] for k in ("min_terms", "max_terms", "max_operand")
    }  # RL's task is the one it learnt
    tokenizer, model = load_tokenizer(path), load_model(path)
    items = LookupTask(min_terms=task["min_terms"], max_terms=task["max_terms"], max_operand=task["max_operand"]).split(
        10_000, 48
    )
    outcomes = []

    async def counting(client, item):
        create = client.chat.completions.create
        n = 0

        async def create_and_count(**kwargs):
            nonlocal n
            reply = await create(**kwargs)
            n += len(reply.choices[0].message.tool_calls or [])
            return reply

        client.chat.completions.create = create_and_count
        reward = await episode(client, item)
        outcomes.append((item["thing"] in guessed, n, reward))
        return reward

    params = SamplingParams(max_new_tokens=64, greedy=True, stop_token_ids=(tokenizer.eos_token_id,))
    max_len = model.config.max_position_embeddings
    engine = LocalEngine(model, max_slots=48, max_len=max_len, stop_token_ids=params.stop_token_ids).start()
    try:
        out = evaluate_agent(engine, tokenizer, items, counting, params, max_len)
    finally:
        engine.stop()
    assert 0 < out["eval_accuracy"] < 1 and out["eval_episode_failures"] == 0, out
    looked_up = [(n, r) for g, n, r in outcomes if not g]
    assert all(n >= 1 for n, _ in looked_up) and statistics.mean(r for _, r in looked_up) > 0.5, looked_up
    assert statistics.mean(n == 0 for g, n, _ in outcomes if g) > 0.5, outcomes
