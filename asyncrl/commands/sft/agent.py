"""SFT on an agentic built-in task (``lookup``: items carry a ``transcript``): whole multi-turn conversations
tokenised exactly as the agent proxy sends them at RL time, evaluated by running the task's episodes."""

from __future__ import annotations

import dataclasses

from asyncrl.api.workflow import AgenticTask
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import task_options
from asyncrl.data.datasets import make_task
from asyncrl.engine.local import LocalEngine
from asyncrl.types import SamplingParams


def scoring_engine(model, max_len: int, n: int) -> LocalEngine:
    """An engine for held-out evaluation: up to 64 sequences at once."""
    return LocalEngine(model, max_slots=max(1, min(64, n)), max_len=max_len).start()


class AgentTask:
    """An agentic built-in task: its transcripts tokenised as the proxy would, its episodes for evaluation."""

    def __init__(self, tokenizer, tools: list[dict] | None, episode: str):
        from asyncrl.agent.chat import ChatRenderer
        from asyncrl.data.formats import turn_end_id

        self.renderer = ChatRenderer(tokenizer, turn_end_id(tokenizer))
        self.tokenizer, self.tools, self.episode = tokenizer, tools, episode

    def example(self, item: dict) -> tuple[list[int], list[int]]:
        from asyncrl.agent.tasks.transcripts import transcript_ids

        return transcript_ids(self.renderer, item["transcript"], self.tools)

    def scorer(self, items: list[dict], max_new_tokens: int, max_len: int) -> "_AgentScorer":
        from asyncrl.data.formats import stop_ids

        params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True, stop_token_ids=stop_ids(self.tokenizer))
        return _AgentScorer(self, items, params, max_len)


@dataclasses.dataclass
class _AgentScorer:
    """Held-out accuracy of an agentic task: its episodes run against an engine of the model."""

    task: AgentTask
    items: list[dict]
    params: SamplingParams
    max_len: int

    def __call__(self, model) -> dict:
        from asyncrl.agent.tasks.evaluate import evaluate_agent

        engine = scoring_engine(model, self.max_len, 64)
        try:
            return evaluate_agent(engine, self.task.tokenizer, self.items, self.task.episode, self.params, self.max_len)
        finally:
            engine.stop()

    def close(self) -> None:
        pass


def agent_task(cfg: SFTConfig, tokenizer) -> AgentTask | None:
    """The agentic built-in task being fine-tuned on (one whose generator names its episode function), else
    None. Only the built-in task (train_dataset.path empty or builtin:NAME, no mixture) can be one."""
    path = cfg.train_dataset.path
    if (path and not path.startswith("builtin:")) or cfg.train_dataset.mixture:
        return None
    name = path[len("builtin:") :] or cfg.task.name
    gen, _ = make_task(name, task_options(cfg.task, name))
    if not isinstance(gen, AgenticTask):
        return None
    if not _renders_tools(tokenizer, gen.tools):
        raise ConfigError(
            f"model.path: task '{name}' trains on tool-use transcripts, and this model's chat "
            "template does not show the tools (make the model with `asyncrl init-model --task "
            f"{name}`)"
        )
    return AgentTask(tokenizer, gen.tools, gen.episode)


def _renders_tools(tokenizer, tools: list[dict] | None) -> bool:
    if not getattr(tokenizer, "chat_template", None):
        return False
    if not tools:
        return True
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools, tokenize=False)
    return all(t["function"]["name"] in text for t in tools)
