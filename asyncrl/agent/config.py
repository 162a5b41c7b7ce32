"""The ``agent`` section: your episode function, its proxy and how its calls become samples."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError
from asyncrl.plugins import load_object

EXPORTS = ("individual", "concat")
CLIENTS = ("auto", "openai", "inprocess")


@dataclass
class AgentConfig:
    episode: str = ""
    """Your agent: an import path package.module:name of `async def episode(client, item) -> float | dict`
    (or an object with such an `episode` method). `client` is an OpenAI-compatible async client bound to this
    episode; the return value is the reward of its last call, or {completion_id: reward} per call."""
    timeout_s: float = 300.0
    """An episode that runs longer is cancelled, counted in agent_episode_failures and dropped."""
    export: str = "individual"
    """individual: one sample per LLM call (its prompt masked, its output trained) | concat: one sample per
    conversation (every assistant turn trained, tool and user tokens between them masked)."""
    turn_discount: float = 1.0
    """γ over calls: a call's reward is its own + γ × the next call's (the episode reward flows back)."""
    tool_parser: str = "hermes"
    """How tool calls are read from replies: hermes (<tool_call>{...}</tool_call>: Qwen2.5/3, the tiny agent
    model) | llama3_json | none."""
    client: str = "auto"
    """openai: the official openai.AsyncOpenAI client over HTTP to the proxy | inprocess: an object with the
    same interface calling the proxy directly | auto: openai when the package is installed."""
    proxy_host: str = "127.0.0.1"
    """Where the HTTP proxy listens (a non-loopback address needs agent.admin_key)."""
    proxy_port: int = 0
    """Its port (0 = a free one)."""
    admin_key: str = ""
    """Required to bind the proxy to a non-loopback address."""
    options: dict = field(default_factory=dict)
    """Keyword arguments for the episode function (e.g. tool latency of a built-in task)."""

    def validate(self) -> None:
        if self.export not in EXPORTS:
            raise ConfigError(f"agent.export must be one of {list(EXPORTS)}, got '{self.export}'")
        if self.client not in CLIENTS:
            raise ConfigError(f"agent.client must be one of {list(CLIENTS)}, got '{self.client}'")
        from asyncrl.agent.tools import PARSERS

        if self.tool_parser not in PARSERS:
            raise ConfigError(f"agent.tool_parser must be one of {sorted(PARSERS)}, got '{self.tool_parser}'")
        if not self.timeout_s > 0:
            raise ConfigError(f"agent.timeout_s must be > 0, got {self.timeout_s}")
        if not 0 <= self.turn_discount <= 1:
            raise ConfigError(f"agent.turn_discount must be in [0, 1], got {self.turn_discount}")

    def validate_for_run(self) -> None:
        """The checks that only matter when workflow.name is agent."""
        if not self.episode:
            raise ConfigError("workflow.name=agent needs agent.episode: the import path of your episode function")
        try:
            resolve_episode(self.episode)
        except ValueError as e:
            raise ConfigError(f"agent.episode: {e}") from e
        from asyncrl.agent.proxy import check_bind

        try:
            check_bind(self.proxy_host, self.admin_key)
        except ValueError as e:
            raise ConfigError(f"agent.proxy_host: {e}") from e


def resolve_episode(spec: str):
    target = load_object(spec)
    fn = getattr(target, "episode", target)
    if not callable(fn):
        raise ValueError(f"'{spec}' is neither a function nor an object with an episode method")
    return fn
