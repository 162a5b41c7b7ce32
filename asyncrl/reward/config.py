"""Config section for the reward service (``reward``) and its LLM judge (``reward.judge``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError


@dataclass
class JudgeConfig:
    url: str = ""
    """An OpenAI-compatible endpoint up to /v1 (vLLM, SGLang, asyncrl serve, a hosted API) whose model scores
    every completion (asyncrl/reward/judge.py; docs/rewards.md). Empty (and no serve): no judge."""
    serve: str = ""
    """A checkpoint directory (or builtin:NAME) the run serves as its judge (asyncrl serve, in a child process
    on judge.device with judge.threads), instead of url."""
    device: str = "cpu"
    """Where a served judge runs (cpu | cuda | cuda:N): its own device, apart from the trainer's and the
    rollout engines'."""
    threads: int = 1
    """Torch threads of a served judge on the CPU."""
    model: str = ""
    """The model name sent to the endpoint (hosted APIs and vLLM need it; asyncrl serve takes any)."""
    api_key_env: str = ""
    """The environment variable holding the endpoint's key (sent as a bearer token); the key itself is never
    written in a config."""
    template: str = ""
    """The judge's prompt, with {question}, {response} and {reference} (the item's answer); empty = the default
    (asks for 'Score: N' from 0 to 10)."""
    score: str = "0-10"
    """How the answer is read: LOW-HIGH (the number after 'Score:', else N/HIGH, else a number closing the
    answer, in that range, scaled to 0-1) | verdict (the last of the judge.verdicts phrases in the answer, not
    negated). An answer that gives two different scores or verdicts (one may be quoted from the response judged)
    is ambiguous: refused, counted in reward_errors/JudgeAmbiguous. An answer that cannot be read is a counted
    reward failure (reward_errors) scoring reward.default, never a silent 0."""
    verdicts: dict = field(default_factory=dict)
    """Verdict phrases (any case, one or more words) and their rewards in [0, 1] for score=verdict (empty =
    {correct: 1, incorrect: 0})."""
    combine: str = "judge"
    """With a verifiable reward (the dataset's or reward.fn): judge (the judge alone) | weighted
    ((1 - weight) * verifier + weight * judge) | abstain (the judge only where the verifier returns None)."""
    weight: float = 0.5
    """The judge's weight for combine=weighted."""
    max_tokens: int = 16
    """Tokens the judge may answer with."""
    timeout_s: float = 30.0
    """Per request; a judge call also obeys reward.timeout_s as a whole."""
    retries: int = 2
    """Further tries after a connection error, a timeout, HTTP 429 or 5xx (with backoff)."""
    max_concurrency: int = 8
    """Judge requests in flight at once from one reward worker (reward.workers of them run side by side)."""

    @property
    def enabled(self) -> bool:
        return bool(self.url or self.serve)

    def validate(self) -> None:
        from asyncrl.reward.judge import COMBINE, parse_range

        if self.url and self.serve:
            raise ConfigError("reward.judge.url and reward.judge.serve are two judges: set one")
        if self.combine not in COMBINE:
            raise ConfigError(f"reward.judge.combine must be one of {list(COMBINE)}, got '{self.combine}'")
        if not 0.0 <= self.weight <= 1.0:
            raise ConfigError(f"reward.judge.weight must be in [0, 1], got {self.weight}")
        if self.score != "verdict":
            try:
                parse_range(self.score)
            except ValueError as e:
                raise ConfigError(f"reward.judge.score: {e}") from None
        for phrase, value in self.verdicts.items():
            words = re.findall(r"[a-z_]+", str(phrase).lower())
            if not words or isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ConfigError(
                    f"reward.judge.verdicts: {phrase!r}: {value!r} must map a phrase of words to a reward in [0, 1]"
                )
        if self.template and "{response}" not in self.template:
            raise ConfigError("reward.judge.template must hold {response} (and may hold {question}, {reference})")
        if self.template:
            try:
                self.template.format(question="", response="", reference="")
            except (KeyError, IndexError, ValueError) as e:
                raise ConfigError(
                    f"reward.judge.template cannot be filled in ({type(e).__name__}: {e}): only "
                    "{question}, {response} and {reference} are fields; write a literal brace as {{ "
                    "or }}"
                ) from None
        if self.timeout_s <= 0 or self.retries < 0 or self.max_concurrency < 1 or self.max_tokens < 1:
            raise ConfigError("reward.judge.timeout_s must be > 0, retries >= 0, max_concurrency and max_tokens >= 1")

    def build(self, url: str | None = None):
        """The ``Judge`` this section describes (``url``: a served judge's)."""
        from asyncrl.reward.judge import DEFAULT_TEMPLATE, VERDICTS, Judge

        return Judge(
            url or self.url,
            self.model,
            self.api_key_env,
            self.template or DEFAULT_TEMPLATE,
            self.score,
            dict(self.verdicts or VERDICTS),
            self.max_tokens,
            0.0,
            self.timeout_s,
            self.retries,
            self.max_concurrency,
        )


@dataclass
class RewardConfig:
    fn: str = ""
    """Reward function as ``package.module:function`` (empty = the dataset's own verifier). Built in:
    asyncrl.reward.math_reward:math_reward, asyncrl.reward.code_reward:code_reward,
    asyncrl.reward.gym_reward:gym_reward. With train_dataset.mixture it replaces the verifier of every source
    that does not name its own reward_fn."""
    default: float = 0.0
    """Reward given when the function raises or times out (counted in reward_errors / reward_timeouts)."""
    timeout_s: float = 30.0
    """Per-call time limit; past it the worker is killed (with any sandbox it started) and the call scores
    the default. Only enforced with workers > 0."""
    workers: int = 2
    """Reward worker processes scoring concurrently (fresh interpreters, not forks of the trainer); 0 = call
    the function in the calling thread (no processes, no timeout)."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the reward function; they override item fields of the same name. E.g. for the
    code reward {mode: all, cpu_s: 2, sandbox: auto}; for the math reward {timeout_s: 5}. With
    train_dataset.mixture they go to the sources that do not name their own reward_fn (a source's
    reward_kwargs win)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """An LLM judge scoring completions, alone or with the verifiable reward (reward.judge.*)."""
    model: str = ""
    """A reward model: a sequence-classification checkpoint (one output; asyncrl rm trains one from preference
    pairs) scoring every (prompt, response) in this process, batched (asyncrl/reward/model.py). Its raw score
    is the reward (mixed with the verifiable one by reward.model_weight); reward.timeout_s does not apply."""
    model_device: str = "cpu"
    """Where the reward model runs (cpu | cuda | cuda:N): its own device, apart from the trainer's."""
    model_batch_size: int = 16
    """Samples the reward model scores in one forward pass at most (those waiting together)."""
    model_weight: float = 1.0
    """reward = (1 - w) * the verifiable reward + w * the model's score; 1 = the model alone."""

    def validate(self) -> None:
        self.judge.validate()
        if self.model and self.judge.enabled:
            raise ConfigError("reward.model and reward.judge are two scorers: set one")
        if not 0.0 <= self.model_weight <= 1.0 or self.model_batch_size < 1:
            raise ConfigError("reward.model_weight must be in [0, 1] and reward.model_batch_size >= 1")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.model_device):
            raise ConfigError(f"reward.model_device must be cpu, cuda or cuda:N, got {self.model_device!r}")
        if self.model.startswith("builtin:"):
            raise ConfigError(
                f"reward.model={self.model}: the built-in models are language models, not reward models; train "
                "one with asyncrl rm (docs/rewards.md) and give its output_dir"
            )
        if self.workers < 0:
            raise ConfigError(f"reward.workers must be >= 0, got {self.workers}")
        if self.timeout_s <= 0:
            raise ConfigError(f"reward.timeout_s must be > 0, got {self.timeout_s}")
        if self.fn:
            from asyncrl.reward.base import load_reward_fn

            try:
                load_reward_fn(self.fn)
            except ValueError as e:
                raise ConfigError(f"reward.fn: {e}") from e
