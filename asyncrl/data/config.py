"""Config sections for where prompts come from."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError

ROW_TYPES = ("auto", "gsm8k", "math", "qa", "code")


@dataclass
class TaskConfig:
    name: str = "arith"
    """The built-in task: 'arith' (multi-step integer arithmetic with a chain of thought)."""
    min_terms: int = 3
    """Fewest numbers in a problem (terms - 1 operations)."""
    max_terms: int = 5
    """Most numbers in a problem."""
    max_operand: int = 99
    """Largest operand."""
    ops: str = "+-"
    """Operators drawn from: any of '+-*' ('*' multiplies by one digit)."""
    direct_frac: float = 0.0
    """Fraction of reference solutions (used by SFT) that state the answer without the working."""


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
    max_prompt_tokens: int = 0
    """Skip (and count in data_skipped_long) items whose chat-formatted prompt has more tokens than this;
    0 = no limit."""
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
        if self.max_prompt_tokens < 0:
            raise ConfigError(f"train_dataset.max_prompt_tokens must be >= 0, got {self.max_prompt_tokens}")
        unknown = set(self.fields) - {"question", "answer", "solution", "tests", "fn_name"}
        if unknown:
            raise ConfigError(f"train_dataset.fields: unknown item field(s) {sorted(unknown)}; map one of "
                              "question, answer, solution, tests, fn_name")


@dataclass
class ValidDatasetConfig:
    size: int = 200
    """Held-out problems evaluated."""
    seed: int = 10_000
    """Seed of the held-out split (disjoint from the training stream)."""
    path: str = ""
    """Held-out file or saved-dataset directory (read with train_dataset's type, fields and template); '' =
    a split of the training source: a seeded disjoint split of the built-in or gym task, or up to `size`
    rows (at most a tenth) held out of a training file and never trained on."""
    split: str = "test"
    """Split to read from a saved DatasetDict directory."""
