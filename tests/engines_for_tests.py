"""Scripted engines shared by the agent tests: they reply with given texts (as token ids + the end-of-turn token)
and log what they received, so that a test can check the exact tokens of every call."""

import asyncio

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.client import InProcessClient
from asyncrl.agent.proxy import AgentProxy
from asyncrl.agent.tasks.lookup import episode
from asyncrl.agent.tasks.transcripts import assistant_ids
from asyncrl.api.workflow import WorkflowContext
from asyncrl.types import Completion, SamplingParams


class ScriptedEngine:
    """Replies with scripted texts (as token ids + the end-of-turn token) and logs what it received."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.version = tokenizer, list(replies), 0
        self.received, self.generated = [], []

    async def generate(self, prompt_ids, params):
        out = []
        for _ in range(params.n):
            ids = self.tokenizer(self.replies.pop(0), add_special_tokens=False).input_ids + [
                self.tokenizer.eos_token_id
            ]
            self.received.append(list(prompt_ids))
            self.generated.append(ids)
            out.append(Completion(list(prompt_ids), ids, [-0.25] * len(ids), [self.version] * len(ids), "stop"))
        await asyncio.sleep(0)
        return out

    def update_weights(self, update, timeout=None):
        self.version = update.version


def agent_context(tokenizer, n=1, max_new_tokens=48):
    """The WorkflowContext an AgentWorkflow gets: ``n`` episodes per item, stopping at the end-of-turn token."""
    params = SamplingParams(n=n, max_new_tokens=max_new_tokens, stop_token_ids=(tokenizer.eos_token_id,))
    return WorkflowContext(tokenizer, None, params, 512, (tokenizer.eos_token_id,))


class TranscriptEngine:
    """Replies with the next scripted assistant text (its tokens + the end-of-turn token), like a model that
    writes exactly the reference transcript; records the prompts it received."""

    def __init__(self, renderer, texts):
        self.renderer, self.texts, self.version, self.received = renderer, list(texts), 0, []

    async def generate(self, prompt_ids, params):
        self.received.append(list(prompt_ids))
        ids = assistant_ids(self.renderer, self.texts.pop(0))
        await asyncio.sleep(0)
        return [Completion(list(prompt_ids), ids, [-0.5] * len(ids), [0] * len(ids), "stop")]


def play_lookup(tokenizer, item, texts, **options):
    """Runs the lookup task's episode for ``item`` against an engine that writes ``texts``; (reward, recorded
    episode)."""
    renderer = ChatRenderer(tokenizer, tokenizer.eos_token_id)
    engine = TranscriptEngine(renderer, texts)
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(tokenizer.eos_token_id,))
    proxy = AgentProxy(renderer, params, 512, engine=engine)

    async def run():
        key = proxy.open()
        try:
            return await episode(InProcessClient(proxy, key), item, **options)
        finally:
            recorded["episode"] = proxy.close(key)

    recorded = {}
    reward = asyncio.run(run())
    return reward, recorded["episode"]


def assistant_texts(item):
    """The assistant turns of ``item``'s reference transcript."""
    return [m["content"] for m in item["transcript"] if m["role"] == "assistant"]
