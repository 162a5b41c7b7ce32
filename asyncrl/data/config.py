"""Config sections for where prompts come from, and the two entry points that turn them into data:
:func:`dataset_from_config` and :func:`eval_set_from_config`. The functions of :mod:`asyncrl.data` take plain
arguments; this module is the only place that reads the sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from asyncrl.configlib import ConfigError
from asyncrl.data import Dataset, file_dataset, file_eval_set, gym_dataset, make_task, task_dataset
from asyncrl.data.formats import check_template
from asyncrl.data.gym import PREFIX as GYM_PREFIX

ROW_TYPES = ("auto", "gsm8k", "math", "qa", "code")
ITEM_FIELDS = ("question", "answer", "solution", "tests", "fn_name")
BUILTIN_PREFIX = "builtin:"


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
    """Fraction in [0, 1] of reference solutions (used by SFT) that state the answer without the working."""

    def validate(self) -> None:
        make_task(self.name, task_options(self))


@dataclass
class TrainDatasetConfig:
    batch_size: int = 16
    """B: prompt groups per training step (each group holds gconfig.n_samples samples)."""
    seed: int = 0
    """Seed of the training problem stream (and of the per-epoch shuffle of a file)."""
    path: str = ""
    """Where prompts come from: '' or 'builtin:arith' = the built-in task (task.*); a local .jsonl / .json /
    .parquet file or a directory written by datasets' save_to_disk; 'gym:NAME' = a reasoning-gym task
    (optional extra 'gym'), scored by its own scorer. A relative path is looked up from the working
    directory, then from the directory that holds the asyncrl package (so asyncrl/assets/data/... works
    from anywhere)."""
    type: str = "auto"
    """Row format: auto | gsm8k (answer ends with '#### 42') | math (problem + solution with \\boxed{}) |
    qa (question + answer) | code (question + tests). auto decides from the first row's fields. Sets the
    default reward: math-verify for gsm8k/math/qa, the sandboxed code reward for code."""
    fields: dict = field(default_factory=dict)
    """Field mapping {item field: column}, e.g. {question: problem, answer: final_answer}. Unmapped fields
    are looked for under their usual names (question/problem/prompt, answer, solution, tests/input_output)."""
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

    def validate(self) -> None:
        if self.type not in ROW_TYPES:
            raise ConfigError(f"train_dataset.type must be one of {list(ROW_TYPES)}, got '{self.type}'")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 0:
            raise ConfigError(f"train_dataset.max_prompt_tokens must be >= 0 (0 = no limit), got "
                              f"{self.max_prompt_tokens}")
        unknown = set(self.fields) - set(ITEM_FIELDS)
        if unknown:
            raise ConfigError(f"train_dataset.fields: unknown item field(s) {sorted(unknown)}; map one of "
                              f"{', '.join(ITEM_FIELDS)}")
        for name, column in self.fields.items():
            if not isinstance(column, str) or not column:
                raise ConfigError(f"train_dataset.fields.{name} must be a column name, got {column!r}")
        try:
            check_template(self.prompt_template)
        except ValueError as e:
            raise ConfigError(f"train_dataset.prompt_template: {e}") from None


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
def dataset_from_config(task: TaskConfig, train: TrainDatasetConfig, valid: ValidDatasetConfig, *, tokenizer=None,
                        default_max_prompt_tokens: int | None = None) -> Dataset:
    """The training stream, the held-out list and the default reward of the configured source.

    ``tokenizer`` (optional) enables the prompt limit and pre-tokenises prompts with the chat template into
    ``prompt_ids``. ``default_max_prompt_tokens`` is the limit when ``train_dataset.max_prompt_tokens`` is
    None: the model's context minus ``gconfig.max_new_tokens``."""
    task.validate()
    train.validate()
    kind, name = _source(train.path)
    if valid.path and kind != "file":
        raise ConfigError("valid_dataset.path is read with the training file's format: give train_dataset.path "
                          "a file too, or leave valid_dataset.path empty for the task's own held-out split")
    common = dict(seed=train.seed, valid_seed=valid.seed, valid_size=valid.size, tokenizer=tokenizer,
                  max_prompt_tokens=prompt_limit(train.max_prompt_tokens, default_max_prompt_tokens))
    if kind == "builtin":
        return task_dataset(name or task.name, task_options(task), template=train.prompt_template, **common)
    if kind == "gym":
        return gym_dataset(name, train.gym_options, template=train.prompt_template, **common)
    return file_dataset(train.path, split=train.split, shuffle=train.shuffle, valid_path=valid.path,
                        valid_split=valid.split, **_row_options(train), **common)


def eval_set_from_config(task: TaskConfig, valid: ValidDatasetConfig, train: TrainDatasetConfig | None = None, *,
                         tokenizer=None, default_max_prompt_tokens: int | None = None
                         ) -> tuple[list[dict], Callable[..., float]]:
    """Held-out items and their default reward for evaluation alone (``asyncrl eval``): the file
    ``valid_dataset.path`` (read with ``train``'s type, fields and template; no training source needed), else
    the held-out split of the training source (the built-in task by default)."""
    train = train or TrainDatasetConfig()
    if not valid.path:
        data = dataset_from_config(task, train, valid, tokenizer=tokenizer,
                                   default_max_prompt_tokens=default_max_prompt_tokens)
        return data.valid, data.reward_fn
    train.validate()
    return file_eval_set(valid.path, size=valid.size, split=valid.split, tokenizer=tokenizer,
                         max_prompt_tokens=prompt_limit(train.max_prompt_tokens, default_max_prompt_tokens),
                         **_row_options(train))


def prompt_limit(configured: int | None, default: int | None) -> int | None:
    """The prompt token limit (None = none): ``configured``, 0 meaning none, or ``default`` when it is None."""
    if configured is not None:
        return configured or None
    if default is not None and default < 1:
        raise ConfigError(f"train_dataset.max_prompt_tokens: its default, the model's context minus "
                          f"max_new_tokens, is {default}, which leaves no room for a prompt; lower max_new_tokens "
                          "(gconfig.max_new_tokens in training)")
    return default


def task_options(task: TaskConfig) -> dict:
    """The built-in task's options: every ``task.*`` key but ``name``."""
    return {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.name != "name"}


def _row_options(train: TrainDatasetConfig) -> dict:
    return dict(row_type=train.type, fields=train.fields, template=train.prompt_template,
                skip_bad_rows=train.skip_bad_rows)


def _source(path: str) -> tuple[str, str]:
    """('builtin' | 'gym' | 'file', the name or path) of ``train_dataset.path``."""
    if not path or path.startswith(BUILTIN_PREFIX):
        return "builtin", path[len(BUILTIN_PREFIX):]
    if path.startswith(GYM_PREFIX):
        return "gym", path[len(GYM_PREFIX):]
    return "file", path
