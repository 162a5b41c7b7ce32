"""The typed config tree. YAML files hold only overrides; ``asyncrl train --help-config`` lists every key.

Key names follow AReaL where a user would look for them: ``rollout.max_head_offpolicyness`` (η, the max
staleness), ``train_dataset.batch_size`` (B, in prompt groups), ``gconfig.n_samples``,
``gconfig.max_new_tokens``, ``gconfig.temperature``, ``actor.eps_clip``, ``total_train_steps``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from asyncrl.agent.config import AgentConfig
from asyncrl.cluster.config import LAUNCHERS, ClusterConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig
from asyncrl.engine.config import RolloutConfig
from asyncrl.models.config import ModelConfig
from asyncrl.models.hf import model_recipe
from asyncrl.reward.config import RewardConfig
from asyncrl.telemetry.config import StatsLoggerConfig, WatchdogConfig
from asyncrl.trainer.config import ActorConfig
from asyncrl.types import MIN_TEMPERATURE
from asyncrl.workflow.config import WorkflowConfig

MAX_BATCH_SAMPLES = 1 << 20
"""The most samples (train_dataset.batch_size x gconfig.n_samples) a step may have: a batch is held in memory."""


@dataclass
class GenerationConfig:
    n_samples: int = 8
    """Samples per prompt (the group size for GRPO)."""
    max_new_tokens: int = 1024
    """Most tokens generated per sample (a model under 50M parameters, such as the built-in ones, gets 64 unless
    set: SMALL_MODEL_RECIPE)."""
    temperature: float = 1.0
    """Sampling temperature (training log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""


@dataclass
class EvaluatorConfig:
    freq_steps: int = 10
    """Evaluate held-out accuracy every N training steps (0 = only at the start and end)."""
    greedy: bool = True
    """Greedy decoding for evaluation (else sample at gconfig.temperature)."""
    success_threshold: float = 1.0
    """eval_accuracy counts the held-out items whose reward reaches this (eval_reward_mean is the plain mean)."""
    background: bool | Literal["auto"] = "auto"
    """Evaluate beside training (asyncrl train, single-turn workflows): the evaluation of version v runs on a
    copy of v's weights in the evaluation engine while the trainer goes on, and its record is logged against v
    when it ends (a line {"step": v, "evaluation": true, "eval_...": ...} in metrics.jsonl, merged into step v's
    record by every reader); one at a time; the last evaluation is waited for at the end. auto: beside training
    where the evaluation has a device or cores of its own (a GPU; a CPU with a core that neither the trainer nor
    the built-in engine uses), in the foreground where it would only take cores from them (the CPU split that
    shares every core: on 2 cores the default run took 354 s in the background against 281 s in the foreground);
    said at start-up, and in the verdict when evaluation takes the trainer's time."""


@dataclass
class SaverConfig:
    freq_steps: int = 0
    """Save a checkpoint every N steps (0 = by time, and at the end). A checkpoint is a Hugging Face model
    directory plus everything a resumed run needs (optimizer, RNGs, data position, untrained rollouts)."""
    freq_seconds: float = 600.0
    """Also save when this much training time has passed since the last save (0 = not by time)."""
    keep_last: int = 3
    """Checkpoints kept in RUN_DIR/checkpoints (older ones are removed once a newer one is complete)."""
    background: bool = True
    """Write checkpoints in a writer thread: the trainer copies the weights, optimizer and RNG state (to CPU
    memory: one more copy of each, briefly) and trains on while they are written, fsynced and renamed; the next
    save and the end of the run wait for the write. FSDP and LoRA trainers always save in the foreground, and so
    does asyncrl sft."""
    on_error: str = "stop"
    """When a checkpoint cannot be written (disk full): stop (the run ends with one line; the previous
    checkpoint stays valid) | continue (warn and train on)."""

    def validate(self) -> None:
        if self.freq_steps < 0 or not self.freq_seconds >= 0 or self.keep_last < 1:
            raise ConfigError("saver.freq_steps and saver.freq_seconds must be >= 0 and saver.keep_last >= 1")
        if self.on_error not in ("stop", "continue"):
            raise ConfigError(f"saver.on_error must be stop or continue, got '{self.on_error}'")


@dataclass
class TrainConfig:
    experiment_name: str = "asyncrl"
    """Run directory: output_dir/experiment_name/trial_name."""
    trial_name: str = "default"
    """Run directory: output_dir/experiment_name/trial_name."""
    output_dir: str = "outputs"
    """Where run directories go."""
    seed: int = 1
    """Seed for sampling and initialisation."""
    total_train_steps: int = 200
    """Training steps (each consumes train_dataset.batch_size groups and advances the version by 1)."""
    max_train_time_s: float = 600.0
    """Stop after this much wall time in seconds (0 = no limit), then evaluate and save."""
    progress_bar: bool = True
    """Show a progress bar when the output is a terminal (never when it goes to a file or a pipe: one log line per
    step there)."""
    report: bool = True
    """Write RUN_DIR/report.html at the end of the run (plots; needs the 'report' extra, else a warning)."""
    resume: str = "auto"
    """auto: `asyncrl train` on a run directory with a checkpoint continues from it if the configuration matches
    (keys that only change how the run is watched, stopped or placed may differ; other differences are refused
    with the keys listed) | fresh: start over (an earlier run in the directory is moved aside, not deleted)."""
    launcher: str = "local"
    """How the run's processes start: local (this machine: trainer ranks as child processes) | ray (a Ray
    placement group; cluster.ray_address, else a local Ray)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Devices and rendezvous."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The built-in task and its difficulty."""
    train_dataset: TrainDatasetConfig = field(default_factory=TrainDatasetConfig)
    """Training prompts."""
    valid_dataset: ValidDatasetConfig = field(default_factory=ValidDatasetConfig)
    """Held-out prompts."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The reward service."""
    gconfig: GenerationConfig = field(default_factory=GenerationConfig)
    """Sampling for rollouts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Asynchronous rollout and the built-in engine."""
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    """What each admitted item runs (single-turn RLVR by default, an agent, or your own workflow)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Agentic RL (workflow.name=agent): your episode function, the proxy and how calls become samples."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Optimisation and the policy loss."""
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    """Held-out evaluation."""
    saver: SaverConfig = field(default_factory=SaverConfig)
    """Checkpoints."""
    stats_logger: StatsLoggerConfig = field(default_factory=StatsLoggerConfig)
    """Extra metrics sinks (metrics.jsonl is always written)."""
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    """Run-health checks: no learning signal, failing rewards, non-finite updates."""

    def recipe(self) -> dict:
        return model_recipe(self.model.path, "train")

    def validate(self) -> None:
        for key in ("experiment_name", "trial_name"):
            _check_name(key, getattr(self, key))
        _positive(
            self,
            [
                "train_dataset.batch_size",
                "gconfig.n_samples",
                "gconfig.max_new_tokens",
                "total_train_steps",
                "rollout.max_slots",
                "rollout.threads",
                "valid_dataset.size",
            ],
        )
        _non_negative(
            self,
            [
                "rollout.max_concurrent_rollouts",
                "max_train_time_s",
                "evaluator.freq_steps",
                "saver.freq_steps",
                "gconfig.top_k",
            ],
        )
        if not self.gconfig.temperature >= MIN_TEMPERATURE:
            raise ConfigError(
                f"gconfig.temperature must be >= {MIN_TEMPERATURE} (training log-probs are divided by "
                f"it; lower is greedy in effect: use evaluator.greedy for greedy answers), got "
                f"{self.gconfig.temperature}"
            )
        samples = self.train_dataset.batch_size * self.gconfig.n_samples
        if samples > MAX_BATCH_SAMPLES:
            raise ConfigError(
                f"train_dataset.batch_size x gconfig.n_samples = {samples} samples a step cannot be held "
                f"in memory (at most {MAX_BATCH_SAMPLES}; AReaL's largest recipes use 512 x 16)"
            )
        if not 0 < self.gconfig.top_p <= 1:
            raise ConfigError(f"gconfig.top_p must be in (0, 1], got {self.gconfig.top_p}")
        self.rollout.validate()
        self.model.lora.validate()
        self.task.validate()
        self.train_dataset.validate()
        self.reward.validate()
        self.workflow.validate()
        self.agent.validate()
        if self.workflow.name == "agent":
            self.agent.validate_for_run()
            if self.rollout.request_timeout_s and self.agent.timeout_s >= self.rollout.request_timeout_s:
                raise ConfigError(
                    f"agent.timeout_s={self.agent.timeout_s:g} must be below rollout.request_timeout_s="
                    f"{self.rollout.request_timeout_s:g}, which bounds the whole group: one slow "
                    "episode would cancel its n episodes (none counted as an episode failure)"
                )
            if self.agent.export == "concat" and self.actor.overlong_reward_penalty:
                raise ConfigError(
                    "actor.overlong_reward_penalty reads a sample's length against "
                    "gconfig.max_new_tokens, a budget per call: a sample of agent.export=concat holds "
                    "every call of a chain and would be penalised uncut; use agent.export=individual"
                )
        self.watchdog.validate()
        self.cluster.validate()
        self.saver.validate()
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"launcher must be one of {list(LAUNCHERS)}, got '{self.launcher}'")
        self.stats_logger.validate()
        if self.model.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"model.dtype must be float32 or bfloat16, got '{self.model.dtype}'")
        if self.gconfig.n_samples > self.rollout.max_slots:
            raise ConfigError(
                f"gconfig.n_samples ({self.gconfig.n_samples}) exceeds rollout.max_slots "
                f"({self.rollout.max_slots}): one group must fit in the engine at once"
            )
        self.actor.validate(
            max_staleness=self.rollout.max_staleness,
            n_samples=self.gconfig.n_samples,
            max_new_tokens=self.gconfig.max_new_tokens,
        )
        if self.actor.world_size > self.train_dataset.batch_size:
            raise ConfigError(
                f"actor.backend={self.actor.backend} has {self.actor.world_size} ranks but a batch has "
                f"train_dataset.batch_size={self.train_dataset.batch_size} groups: every rank needs one"
            )

    def cpu_sharing(self) -> str:
        """How the trainer and the built-in engine use the CPU's cores (``asyncrl.cluster.cores``): fixed (their own
        threads), shared (the trainer borrows a core of the engine's while the engine idles) or alternating (η = 0:
        the trainer always borrows it)."""
        if self.cluster.cpu_split != "auto" or not self.cpu_split_applies():
            return "fixed"
        return "alternating" if self.rollout.max_staleness == 0 else "shared"  # η = 0, or auto bounded by 0

    def cpu_split_applies(self) -> bool:
        """Whether cluster.cpu_split=auto shares the cores: the built-in engine in this process, one trainer rank,
        the CPU (elsewhere the trainer and the engines keep actor.threads and rollout.threads)."""
        return (
            self.rollout.placement.kind == "local"
            and self.actor.world_size == 1
            and self.cluster.resolved_device() == "cpu"
        )


@dataclass
class SFTConfig:
    """``asyncrl sft``: the same keys as ``asyncrl train`` for the same things (total_train_steps,
    train_dataset.batch_size, actor.lr, output_dir, gconfig.max_new_tokens, evaluator.freq_steps, ...); of the
    shared sections, SFT reads what it needs (actor: lr, warmup_steps, weight_decay, threads; gconfig:
    max_new_tokens; evaluator and saver: freq_steps)."""

    RENAMED: ClassVar[dict[str, str]] = {
        "steps": "total_train_steps",
        "batch_size": "train_dataset.batch_size",
        "lr": "actor.lr",
        "warmup_steps": "actor.warmup_steps",
        "weight_decay": "actor.weight_decay",
        "threads": "actor.threads",
        "output": "output_dir",
        "eval_every": "evaluator.freq_steps",
        "save_every": "saver.freq_steps",
        "max_new_tokens": "gconfig.max_new_tokens",
    }
    """asyncrl sft's earlier key names, still read (with a deprecation line) for one release."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to fine-tune (model.lora.rank > 0: train LoRA adapters only)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The built-in task whose reference solutions are the training targets (when train_dataset.path is empty
    or builtin:NAME)."""
    train_dataset: TrainDatasetConfig = field(default_factory=lambda: TrainDatasetConfig(batch_size=64))
    """Training examples, read as `asyncrl train` reads them (path, type, fields, prompt_template, ...):
    prompt + response rows (question/prompt with solution/response/answer) or chat rows (messages: loss on
    the assistant turns only); batch_size = examples per step. The stream is shuffled by the top-level seed
    (train_dataset.seed is not used)."""
    valid_dataset: ValidDatasetConfig = field(default_factory=ValidDatasetConfig)
    """Held-out prompts for evaluation during SFT (a file, or held out of the training source)."""
    reward: RewardConfig = field(default_factory=lambda: RewardConfig(workers=0))
    """How held-out answers are scored (reward.fn empty = the data's own verifier): the same reward.fn as RL."""
    output_dir: str = "outputs/sft"
    """Directory of the resulting HF checkpoint (with model.lora: the adapter, and the merged model in
    OUTPUT_DIR/merged)."""
    seed: int = 0
    """Seed of the training stream and initialisation."""
    total_train_steps: int = 1000
    """Optimizer steps."""
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(lr=2e-5, warmup_steps=50, threads=2))
    """The optimizer: actor.lr (peak; linear warm-up, cosine decay to 10 %; 2e-3 for a model under 50M
    parameters unless set), actor.warmup_steps,
    actor.weight_decay (AdamW), actor.threads (torch threads). The RL keys of this section are not used."""
    gconfig: GenerationConfig = field(default_factory=GenerationConfig)
    """gconfig.max_new_tokens: most tokens generated per held-out answer (greedy) in evaluation (96 for a model
    under 50M parameters unless set)."""
    evaluator: EvaluatorConfig = field(default_factory=lambda: EvaluatorConfig(freq_steps=0))
    """evaluator.freq_steps: held-out accuracy every N steps (0 = only at the end)."""
    saver: SaverConfig = field(default_factory=SaverConfig)
    """saver.freq_steps: also write a checkpoint to OUTPUT_DIR/stepN every N steps (0 = only the final one), the
    last saver.keep_last of them kept; Ctrl-C or SIGTERM ends the run after the step in hand with a checkpoint
    of it (exit 130/143), and the same command resumes from it."""
    log_every: int = 10
    """A progress line (step, loss, elapsed time) every this many steps (an evaluation step always has one)."""
    max_length: int = 0
    """Longest example in tokens (0 = the model's context); longer examples are skipped and counted."""
    pack: bool = True
    """Pack several examples side by side into one row (attention stays within each example) instead of
    padding each to the longest."""
    progress_bar: bool = True
    """Show a progress bar when the output is a terminal (never when it goes to a file or a pipe)."""
    resume: str = "auto"
    """auto: a run stopped after a step checkpoint (saver.freq_steps) continues from the newest one in output_dir
    (weights, optimizer, data position, RNG) if the configuration matches (the number of steps, logging,
    evaluation, saving and threads may differ; a larger total_train_steps stretches the cosine schedule over the new
    total, so the learning rate rises again) | fresh: start over (an earlier run's step checkpoints there are
    moved aside with it, to OUTPUT_DIR.replaced-TIME)."""

    def recipe(self) -> dict:
        return model_recipe(self.model.path, "sft")

    def validate(self) -> None:
        _positive(
            self,
            [
                "total_train_steps",
                "train_dataset.batch_size",
                "actor.lr",
                "actor.threads",
                "valid_dataset.size",
                "gconfig.max_new_tokens",
                "log_every",
            ],
        )
        _trainable_lr(self)
        if self.resume not in ("auto", "fresh"):
            raise ConfigError(f"resume must be 'auto' or 'fresh', got '{self.resume}'")
        _non_negative(self, ["evaluator.freq_steps", "saver.freq_steps", "max_length", "actor.warmup_steps"])
        if self.actor.warmup_steps > self.total_train_steps:  # step N of a warm-up of N reaches actor.lr
            logging.getLogger(__name__).warning(
                "actor.warmup_steps=%d is above total_train_steps=%d: the learning rate never reaches "
                "actor.lr=%g (lower actor.warmup_steps)",
                self.actor.warmup_steps,
                self.total_train_steps,
                self.actor.lr,
            )
        self.model.lora.validate()
        self.train_dataset.validate()
        self.reward.validate()


@dataclass
class RMConfig:
    """``asyncrl rm``: a reward model trained on preference pairs (Bradley–Terry), with the keys of
    ``asyncrl train`` where they mean the same: of the shared sections, rm reads train_dataset.path and
    batch_size (pairs per step), valid_dataset.path and size, actor.lr, warmup_steps, weight_decay and threads,
    evaluator.freq_steps."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="builtin:tiny-sft"))
    """The model to start from (a causal LM checkpoint: its trunk, with a new score head of one output)."""
    train_dataset: TrainDatasetConfig = field(default_factory=TrainDatasetConfig)
    """Preference pairs: a JSONL file of {"prompt", "chosen", "rejected"} rows (prompt may be named
    question); batch_size = pairs per step."""
    valid_dataset: ValidDatasetConfig = field(default_factory=lambda: ValidDatasetConfig(size=100))
    """Held-out pairs: a file (path), else `size` rows (at most a fifth) held out of the training file."""
    output_dir: str = "outputs/rm"
    """Directory of the trained reward model (a sequence-classification checkpoint for reward.model)."""
    seed: int = 0
    """Seed of the pair order, the held-out split and the score head."""
    total_train_steps: int = 200
    """Optimizer steps."""
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(lr=1e-4, warmup_steps=10, threads=2))
    """The optimizer: actor.lr (peak; linear warm-up, cosine decay), actor.warmup_steps, actor.weight_decay,
    actor.threads."""
    evaluator: EvaluatorConfig = field(default_factory=lambda: EvaluatorConfig(freq_steps=50))
    """evaluator.freq_steps: held-out pairwise accuracy every N steps (and at the end)."""
    max_length: int = 512
    """Tokens of prompt + response read at most (longer texts are cut from the right)."""
    log_every: int = 10
    """A progress line every this many steps."""

    def validate(self) -> None:
        _positive(
            self,
            ["total_train_steps", "train_dataset.batch_size", "actor.lr", "actor.threads", "max_length", "log_every"],
        )
        _non_negative(self, ["evaluator.freq_steps", "valid_dataset.size", "actor.warmup_steps"])
        _trainable_lr(self)
        if not self.train_dataset.path:
            raise ConfigError(
                "train_dataset.path: asyncrl rm needs a JSONL file of preference pairs "
                '({"prompt": ..., "chosen": ..., "rejected": ...} per line)'
            )


@dataclass
class EvalConfig:
    """``asyncrl eval``: the keys of ``asyncrl train`` where they mean the same (gconfig.n_samples,
    gconfig.max_new_tokens, gconfig.temperature, evaluator.greedy, ...)."""

    RENAMED: ClassVar[dict[str, str]] = {
        "n_samples": "gconfig.n_samples",
        "max_new_tokens": "gconfig.max_new_tokens",
        "temperature": "gconfig.temperature",
        "top_p": "gconfig.top_p",
        "greedy": "evaluator.greedy",
    }
    """asyncrl eval's earlier key names, still read (with a deprecation line) for one release."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The checkpoint to evaluate."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The built-in task (evaluated unless valid_dataset.path names a file)."""
    train_dataset: TrainDatasetConfig = field(default_factory=TrainDatasetConfig)
    """Row format of the file (type, fields, prompt_template), as in training; with valid_dataset.path empty,
    the held-out split of this training source is evaluated."""
    valid_dataset: ValidDatasetConfig = field(default_factory=ValidDatasetConfig)
    """Held-out prompts: the built-in task's held-out split, or the file valid_dataset.path (row format
    detected from its fields; its first `size` rows are evaluated)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """How answers are scored (reward.fn empty = the data's own verifier; reward.default for failures)."""
    gconfig: GenerationConfig = field(default_factory=lambda: GenerationConfig(n_samples=1))
    """gconfig.n_samples answers per prompt (n: pass@k and mean@k are computed from them), gconfig.max_new_tokens
    per answer, gconfig.temperature and gconfig.top_p when not greedy."""
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    """evaluator.greedy: greedy decoding (else sampling; gconfig.n_samples > 1 needs evaluator.greedy=false)."""
    k: list[int] = field(default_factory=lambda: [1])
    """The k of pass@k (unbiased estimator over n samples) to report; each must be <= gconfig.n_samples."""
    output: str = "outputs/eval/results.jsonl"
    """Per-item results as JSONL (prompt, answers, rewards, pass@k); '' = do not write them."""
    threads: int = 2
    """Torch threads."""
    seed: int = 0
    """Sampling seed."""

    def recipe(self) -> dict:
        return model_recipe(self.model.path, "eval")

    def validate(self) -> None:
        _positive(self, ["gconfig.max_new_tokens", "threads", "valid_dataset.size", "gconfig.n_samples"])
        self.reward.validate()
        self.model.lora.validate()
        self.train_dataset.validate()


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


MAX_NAME_BYTES = 200
"""The longest experiment_name or trial_name: one path component (most file systems allow 255 bytes)."""


def _check_name(key: str, name: str) -> None:
    """A run name is one directory under output_dir: not empty, no path separator, not ``.`` or ``..``."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(
            f"{key} must name one directory under output_dir (no '/', not empty, '.' or '..'), got {name[:80]!r}"
        )
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ConfigError(f"{key} is {len(name)} characters long; at most {MAX_NAME_BYTES} bytes (one directory name)")


def _positive(cfg, keys: list[str]) -> None:
    for key in keys:
        if not _get(cfg, key) > 0:
            raise ConfigError(f"{key} must be > 0, got {_get(cfg, key)!r}")


def _trainable_lr(cfg) -> None:
    """SFT and reward models: a learning rate above 1 diverges with AdamW and saved a NaN model with exit 0."""
    if cfg.actor.lr > 1:
        raise ConfigError(
            f"actor.lr={cfg.actor.lr} is above 1, which diverges with AdamW (fine-tuning usually runs at 1e-6..1e-3)"
        )


def _non_negative(cfg, keys: list[str]) -> None:
    for key in keys:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)!r}")
