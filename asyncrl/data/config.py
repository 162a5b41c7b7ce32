"""Config sections for where prompts come from, and the two entry points that turn them into data:
:func:`dataset_from_config` and :func:`eval_set_from_config`. The functions of :mod:`asyncrl.data` take plain
arguments; this module is the only place that reads the sections."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

from asyncrl.configlib import ConfigError
from asyncrl.data.datasets import Dataset, file_dataset, file_eval_set, gym_dataset, make_task, task_dataset
from asyncrl.data.formats import check_template
from asyncrl.data.gym import PREFIX as GYM_PREFIX
from asyncrl.data.mixture import MixtureSchedule, mixture_dataset, split_sizes

ROW_TYPES = ("auto", "gsm8k", "math", "qa", "code", "chat")
ITEM_FIELDS = ("question", "answer", "solution", "tests", "fn_name", "messages")
BUILTIN_PREFIX = "builtin:"
MIXTURE_KEYS = (
    "name",
    "path",
    "weight",
    "type",
    "fields",
    "prompt_template",
    "split",
    "gym_options",
    "valid_path",
    "reward_fn",
    "reward_kwargs",
)
SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass
class LookupOptions:
    """The options of the lookup task only."""

    direct_things: list[str] = field(default_factory=list)
    """The things (apples, coins, ...) whose questions get direct_frac's guesses; empty = every thing."""


@dataclass
class TaskConfig:
    name: str = "arith"
    """The built-in task: 'arith' (multi-step integer arithmetic with a chain of thought) | 'lookup' (an agentic
    task: numbers of made-up entities fetched with a lookup tool, then combined; run it with workflow.name=agent
    and agent.episode=asyncrl.agent.tasks.lookup:episode; its terms are the numbers of a problem, each looked up
    or the last one given, and direct_frac the share of SFT transcripts that guess instead of looking up)."""
    min_terms: int = 3
    """Fewest numbers in a problem (terms - 1 operations); at least 2."""
    max_terms: int = 5
    """Most numbers in a problem; at least min_terms."""
    max_operand: int = 99
    """Largest operand; at least 2."""
    ops: str = "+-"
    """Operators drawn from: one or more of '+', '-', '*' ('*' multiplies by one digit), e.g. '+-*'."""
    direct_frac: float = 0.0
    """Fraction in [0, 1] of reference solutions (used by SFT) that state the answer without the working (the
    lookup task: without looking anything up, a made-up answer)."""
    lookup: LookupOptions = field(default_factory=LookupOptions)
    """Options of the lookup task (task.name=lookup) only."""

    RENAMED: ClassVar[dict[str, str]] = {"direct_things": "lookup.direct_things"}

    def validate(self) -> None:
        if self.name != "lookup" and self.lookup != LookupOptions():
            raise ConfigError(f"task.lookup.* are options of the lookup task (task.name=lookup), not of '{self.name}'")
        make_task(self.name, task_options(self))


@dataclass
class TrainDatasetConfig:
    batch_size: int = 16
    """B: prompt groups per training step (each group holds gconfig.n_samples samples)."""
    seed: int = 0
    """Seed of the training problem stream (and of the per-epoch shuffle of a file)."""
    path: str = ""
    """Where prompts come from: '' or 'builtin:arith' = the built-in task (task.*); a local .jsonl / .json /
    .parquet file or a directory written by datasets' save_to_disk; a hub dataset already in the local Hugging
    Face cache by name ('org/name', 'org/name/CONFIG'; never downloaded); 'gym:NAME' = a reasoning-gym task
    (optional extra 'gym'), scored by its own scorer. A relative path is looked up from the working
    directory, then from the directory that holds the asyncrl package (so asyncrl/assets/data/... works
    from anywhere)."""
    type: str = "auto"
    """Row format: auto | gsm8k (answer ends with '#### 42') | math (problem + solution with \\boxed{}) |
    qa (question + answer) | code (question + tests) | chat (messages: a list of {role, content} turns; the
    prompt is every turn before the last assistant turn). auto decides from the first row's fields. Sets the
    default reward: math-verify for gsm8k/math/qa/chat, the sandboxed code reward for code."""
    fields: dict = field(default_factory=dict)
    """Field mapping {item field: column}, e.g. {question: problem, answer: final_answer}. Unmapped fields
    are looked for under their usual names (question/problem/prompt, answer, solution, tests/input_output). A
    mapped column reaches the reward function under both names (answer= and final_answer=)."""
    prompt_template: str = ""
    """Python format string over the item's fields that builds the user turn, e.g.
    '{question} Put the final answer in \\boxed{{}}.'; empty = the question as is. Fields: a file row's
    columns, the built-in task's question/answer/solution, a gym item's question/answer/metadata/gym_task."""
    split: str = "train"
    """Split to read from a saved DatasetDict directory."""
    max_prompt_tokens: int | None = None
    """Skip (and count in data_skipped_long) items, training and held-out alike, whose chat-formatted prompt
    has more tokens than this. None (default) = the model's context minus gconfig.max_new_tokens; 0 = no
    limit."""
    shuffle: bool = True
    """Shuffle a file's rows at every epoch (seeded by seed + epoch)."""
    skip_bad_rows: bool = True
    """A malformed row is skipped with a warning naming its file and line (counted in data_bad_rows);
    false = stop at the first one with that error."""
    gym_options: dict = field(default_factory=dict)
    """Options of the reasoning-gym task's config for 'gym:NAME', e.g. {min_terms: 2, max_terms: 4}."""
    mixture: list[dict] = field(default_factory=list)
    """Several training sources mixed by weight (empty = the single source `path`). Each entry: path
    (required; a file, builtin:NAME or gym:NAME, as `path`), name (default: the file's stem or the task's
    name; names label the metrics), weight (default 1.0; the share of the stream is weight / total weight),
    type, fields, prompt_template, split, gym_options (default: the train_dataset keys of the same names),
    valid_path (a held-out file for a file source; else its share of valid_dataset.size, in proportion to
    weight and at least 1, is held out of it), reward_fn (package.module:function; default: reward.fn if
    set, else the source's own verifier) and reward_kwargs (bound to that source's function, over
    reward.kwargs). The stream draws each item's source by a weighted choice seeded by train_dataset.seed
    (entry i's own stream is seeded with seed + i); items carry `source`, the name. Metrics per source:
    reward_mean/NAME and samples/NAME each step, eval_accuracy/NAME and eval_reward_mean/NAME at
    evaluations. E.g. train_dataset.mixture=[{path:
    asyncrl/assets/data/gsm8k_train.jsonl, weight: 3, valid_path: asyncrl/assets/data/gsm8k_test.jsonl},
    {name: arith, path: 'builtin:arith', reward_fn: 'my_rewards:partial_credit'}]; the other train_dataset
    keys (seed, shuffle, skip_bad_rows, max_prompt_tokens) apply to every source, and `path` stays empty."""

    def validate(self) -> None:
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 0:
            raise ConfigError(
                f"train_dataset.max_prompt_tokens must be >= 0 (0 = no limit), got {self.max_prompt_tokens}"
            )
        _check_rows("train_dataset", self.type, self.fields, self.prompt_template)
        if not isinstance(self.mixture, list):
            raise ConfigError(f"train_dataset.mixture must be a list of sources, got {self.mixture!r}")
        if self.mixture and self.path:
            raise ConfigError(
                "train_dataset.path and train_dataset.mixture are exclusive: put the path in a "
                "mixture entry ({path: ...}) and leave train_dataset.path empty"
            )
        names = [self._check_entry(i, entry) for i, entry in enumerate(self.mixture)]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ConfigError(
                    f"train_dataset.mixture[{i}].name: '{name}' is the name of entry "
                    f"{names.index(name)} too; give each source its own name"
                )

    def _check_entry(self, i: int, entry) -> str:
        """Check mixture entry ``i`` (one-line errors naming ``train_dataset.mixture[i].KEY``); its name."""
        key = f"train_dataset.mixture[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{key} must be a mapping such as {{path: data.jsonl, weight: 2}}, got {entry!r}")
        for k in entry:
            if k not in MIXTURE_KEYS:
                near = difflib.get_close_matches(str(k), MIXTURE_KEYS, n=1)
                hint = f"did you mean '{near[0]}'?" if near else f"valid keys: {', '.join(MIXTURE_KEYS)}"
                raise ConfigError(f"{key}.{k}: unknown key; {hint}")
        path = entry.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(f"{key}.path is required: a file, 'builtin:NAME' or 'gym:NAME', got {path!r}")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{key}.weight must be a number > 0, got {weight!r}")
        for k in ("type", "prompt_template", "split", "valid_path", "reward_fn"):
            if k in entry and not isinstance(entry[k], str):
                raise ConfigError(f"{key}.{k} must be a string, got {entry[k]!r}")
        for k in ("fields", "gym_options", "reward_kwargs"):
            if k in entry and not isinstance(entry[k], dict):
                raise ConfigError(f"{key}.{k} must be a mapping, got {entry[k]!r}")
        source = _entry(self, entry)
        _check_rows(key, source.type, source.fields, source.prompt_template)
        if entry.get("valid_path") and _source(path)[0] != "file":
            raise ConfigError(f"{key}.valid_path is for a file source; a task ({path}) holds out its own split")
        if entry.get("reward_fn"):
            from asyncrl.reward.base import load_reward_fn

            try:
                load_reward_fn(entry["reward_fn"])
            except ValueError as e:
                raise ConfigError(f"{key}.reward_fn: {e}") from None
        name = entry.get("name", _default_name(path))
        if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name):
            raise ConfigError(
                f"{key}.name must be letters, digits, '_', '-' or '.', got {name!r}"
                + ("" if "name" in entry else " (derived from the path: give a name)")
            )
        return name


@dataclass
class ValidDatasetConfig:
    size: int = 200
    """Held-out problems evaluated."""
    seed: int = 10_000
    """Seed of the held-out split (disjoint from the training stream)."""
    path: str = ""
    """Held-out file or saved-dataset directory (read with train_dataset's type, fields and template); '' =
    a split of the training source: a seeded disjoint split of the built-in or gym task, or up to `size`
    rows (at most a tenth) held out of a training file and never trained on (a file of one row is refused:
    give this path or more rows)."""
    split: str = "test"
    """Split to read from a saved DatasetDict directory."""


# ---- from the sections to the data ----------------------------------------------------------------------
def dataset_from_config(
    task: TaskConfig,
    train: TrainDatasetConfig,
    valid: ValidDatasetConfig,
    *,
    tokenizer=None,
    default_max_prompt_tokens: int | None = None,
) -> Dataset:
    """The training stream, the held-out list and the default reward of the configured source.

    ``tokenizer`` (optional) enables the prompt limit and pre-tokenises prompts with the chat template into
    ``prompt_ids``. ``default_max_prompt_tokens`` is the limit when ``train_dataset.max_prompt_tokens`` is
    None: the model's context minus ``gconfig.max_new_tokens``."""
    task.validate()
    train.validate()
    if train.mixture:
        return _mixture(task, train, valid, tokenizer, default_max_prompt_tokens)
    kind, name = _source(train.path)
    if valid.path and kind != "file":
        raise ConfigError(
            "valid_dataset.path is read with the training file's format: give train_dataset.path "
            "a file too, or leave valid_dataset.path empty for the task's own held-out split"
        )
    common = dict(
        seed=train.seed,
        valid_seed=valid.seed,
        valid_size=valid.size,
        tokenizer=tokenizer,
        max_prompt_tokens=prompt_limit(train.max_prompt_tokens, default_max_prompt_tokens),
    )
    if kind == "builtin":
        return task_dataset(name or task.name, task_options(task, name), template=train.prompt_template, **common)
    if kind == "gym":
        return gym_dataset(name, train.gym_options, template=train.prompt_template, **common)
    return file_dataset(
        train.path,
        split=train.split,
        shuffle=train.shuffle,
        valid_path=valid.path,
        valid_split=valid.split,
        **_row_options(train),
        **common,
    )


def eval_set_from_config(
    task: TaskConfig,
    valid: ValidDatasetConfig,
    train: TrainDatasetConfig | None = None,
    *,
    tokenizer=None,
    default_max_prompt_tokens: int | None = None,
) -> tuple[list[dict], Callable[..., float], dict]:
    """Held-out items, their default reward and the rows skipped (``data_bad_rows``, ``data_skipped_long``) for
    evaluation alone (``asyncrl eval``): the file ``valid_dataset.path`` (read with ``train``'s type, fields and
    template; no training source needed), else the held-out split of the training source (the built-in task by
    default; the rows skipped are then the whole source's, training rows included)."""
    train = train or TrainDatasetConfig()
    if not valid.path:
        data = dataset_from_config(
            task, train, valid, tokenizer=tokenizer, default_max_prompt_tokens=default_max_prompt_tokens
        )
        skipped = {k: v for k, v in data.stats().items() if k in ("data_bad_rows", "data_skipped_long")}
        return data.valid, data.reward_fn, skipped
    train.validate()
    return file_eval_set(
        valid.path,
        size=valid.size,
        split=valid.split,
        tokenizer=tokenizer,
        max_prompt_tokens=prompt_limit(train.max_prompt_tokens, default_max_prompt_tokens),
        **_row_options(train),
    )


def source_lookup(train: TrainDatasetConfig) -> Callable[[int], str | None] | None:
    """For a mixture, the source name of a training item id (its position in the stream), without reading any
    data; None without a mixture."""
    if not train.mixture:
        return None
    train.validate()
    return MixtureSchedule(_names(train), [float(e.get("weight", 1.0)) for e in train.mixture], train.seed)


def _mixture(
    task: TaskConfig,
    train: TrainDatasetConfig,
    valid: ValidDatasetConfig,
    tokenizer,
    default_max_prompt_tokens: int | None,
) -> Dataset:
    """Each entry's dataset (seed ``train.seed + i``, its share of the held-out size), then the mixture."""
    from asyncrl.reward.base import MixtureReward, SourceReward, load_reward_fn

    if valid.path:
        raise ConfigError(
            "valid_dataset.path is not read with train_dataset.mixture: give a file source its own "
            "held-out file (train_dataset.mixture[i].valid_path), or leave valid_dataset.path empty"
        )
    weights = [float(e.get("weight", 1.0)) for e in train.mixture]
    sizes = split_sizes(valid.size, weights)
    sources, rewards = {}, {}
    for i, (name, entry) in enumerate(zip(_names(train), train.mixture)):
        source = _entry(train, entry, seed=train.seed + i)
        try:
            data = dataset_from_config(
                task,
                source,
                dataclasses.replace(valid, size=sizes[i], path=entry.get("valid_path", "")),
                tokenizer=tokenizer,
                default_max_prompt_tokens=default_max_prompt_tokens,
            )
        except ConfigError as e:
            raise ConfigError(f"train_dataset.mixture[{i}] ({name}): {e}") from None
        sources[name] = (weights[i], data)
        own = entry.get("reward_fn")
        rewards[name] = SourceReward(
            load_reward_fn(own) if own else data.reward_fn, dict(entry.get("reward_kwargs", {})), named=bool(own)
        )
    return mixture_dataset(sources, seed=train.seed, reward_fn=MixtureReward(rewards))


def _entry(train: TrainDatasetConfig, entry: dict, seed: int | None = None) -> TrainDatasetConfig:
    """A mixture entry as a single-source section: its keys over ``train``'s."""
    keys = {k: entry[k] for k in ("path", "type", "fields", "prompt_template", "split", "gym_options") if k in entry}
    return dataclasses.replace(train, mixture=[], **keys, **({} if seed is None else {"seed": seed}))


def _names(train: TrainDatasetConfig) -> list[str]:
    return [e.get("name", _default_name(e["path"])) for e in train.mixture]


def _default_name(path: str) -> str:
    """A source's default name: the task's name ('builtin' for 'builtin:', which is task.name), or the file's
    stem."""
    kind, name = _source(path)
    if kind != "file":
        return name or kind
    return Path(name.rstrip("/")).stem


def _check_rows(key: str, row_type: str, fields: dict, template: str) -> None:
    """The row options of ``key`` (train_dataset or one of its mixture entries)."""
    if row_type not in ROW_TYPES:
        raise ConfigError(f"{key}.type must be one of {list(ROW_TYPES)}, got '{row_type}'")
    unknown = set(fields) - set(ITEM_FIELDS)
    if unknown:
        raise ConfigError(f"{key}.fields: unknown item field(s) {sorted(unknown)}; map one of {', '.join(ITEM_FIELDS)}")
    for name, column in fields.items():
        if not isinstance(column, str) or not column:
            raise ConfigError(f"{key}.fields.{name} must be a column name, got {column!r}")
    try:
        check_template(template)
    except ValueError as e:
        raise ConfigError(f"{key}.prompt_template: {e}") from None


def prompt_limit(configured: int | None, default: int | None) -> int | None:
    """The prompt token limit (None = none): ``configured``, 0 meaning none, or ``default`` when it is None."""
    if configured is not None:
        return configured or None
    if default is not None and default < 1:
        raise ConfigError(
            f"train_dataset.max_prompt_tokens: its default, the model's context minus "
            f"max_new_tokens, is {default}, which leaves no room for a prompt; lower max_new_tokens "
            "(gconfig.max_new_tokens in training)"
        )
    return default


def task_options(task: TaskConfig, name: str = "") -> dict:
    """The options of the built-in task ``name`` (default ``task.name``): the shared ``task.*`` keys, and
    those of its own section."""
    shared = {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.name not in ("name", "lookup")}
    own = dataclasses.asdict(task.lookup) if (name or task.name) == "lookup" else {}
    return {**shared, **own}


def _row_options(train: TrainDatasetConfig) -> dict:
    return dict(
        row_type=train.type, fields=train.fields, template=train.prompt_template, skip_bad_rows=train.skip_bad_rows
    )


def _source(path: str) -> tuple[str, str]:
    """('builtin' | 'gym' | 'file', the name or path) of ``train_dataset.path``."""
    if not path or path.startswith(BUILTIN_PREFIX):
        return "builtin", path[len(BUILTIN_PREFIX) :]
    if path.startswith(GYM_PREFIX):
        return "gym", path[len(GYM_PREFIX) :]
    return "file", path
