"""Reading a run directory: ``metrics.jsonl`` (required), ``timeline.jsonl`` and ``config.yaml``.

Every problem with the files is a :class:`ReportError` naming the file (and line), so the command can print
one line instead of a traceback.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.configlib import ConfigError, read_mapping

SPAN_KINDS = ("wait", "train", "sync", "eval", "save", "log")
"""What the trainer thread's timeline spans record, in the order the report lists them."""
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
"""How ``metrics.jsonl`` spells non-finite numbers (JSON has no literal for them)."""


class ReportError(RuntimeError):
    """The run directory cannot be reported on, or the plotting dependency is missing."""


@dataclass(frozen=True)
class Span:
    """A trainer-thread interval from ``timeline.jsonl`` (seconds since the run started)."""

    kind: str
    t0: float
    t1: float
    step: int


@dataclass(frozen=True)
class GenSample:
    """The engine's cumulative counters at time ``t`` (seconds since the run started)."""

    t: float
    busy_s: float
    generated_tokens: int


@dataclass
class Run:
    path: Path
    records: list[dict]  # metrics.jsonl, one per step; step 0 is the evaluation before training
    spans: list[Span] = field(default_factory=list)
    gen: list[GenSample] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)  # samples.jsonl: a few prompts and completions per step

    @property
    def steps(self) -> list[dict]:
        """The training-step records (step >= 1)."""
        return [r for r in self.records if r.get("step", 0) > 0]

    @property
    def evals(self) -> list[dict]:
        """Records with a finite held-out accuracy (step 0 included), in step order."""
        return [r for r in self.records if finite(r.get("eval_accuracy")) is not None]

    def setting(self, dotted: str, default=None):
        """A value of the resolved config, e.g. ``run.setting("rollout.max_head_offpolicyness")``."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def finite(value) -> float | None:
    """``value`` if it is a finite number, else None: what the summary and the plots skip (a missing value,
    or a NaN / inf a diverging run logged)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def num(record: dict, key: str, default: float = 0.0) -> float:
    """``record[key]`` when it is a finite number, else ``default``."""
    value = finite(record.get(key))
    return default if value is None else value


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory; only ``metrics.jsonl`` is required."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ReportError(f"{path}: no such directory")
    if not (path / "metrics.jsonl").is_file():
        raise ReportError(
            f"{path} is not a run directory: it has no metrics.jsonl "
            "(asyncrl train writes outputs/<experiment_name>/<trial_name>/metrics.jsonl)"
        )
    records = read_records(path / "metrics.jsonl")
    if not records:
        raise ReportError(f"{path / 'metrics.jsonl'} holds no records")
    run = Run(path, sorted(records, key=lambda r: r.get("step", 0)))
    if (path / "timeline.jsonl").is_file():
        _read_timeline(run, path / "timeline.jsonl")
    if (path / "config.yaml").is_file():
        run.config = _read_config(path / "config.yaml")
    if (path / "samples.jsonl").is_file():
        run.samples = read_jsonl(path / "samples.jsonl")
    return run


def read_records(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl``, one per step (evaluations that ended beside training merged into their
    step's record), non-finite numbers decoded; a step that is not an integer is a ReportError."""
    records = [_decode(r) for r in read_jsonl(path)]
    for r in records:
        step = r.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int):
            raise ReportError(f"{path}: every record's 'step' must be an integer, got {step!r:.40}")
    return merge_evaluations(records)


def merge_evaluations(records: list[dict]) -> list[dict]:
    """One record per step: an evaluation that ended beside training (``evaluator.background``: a record with
    ``"evaluation": true``, logged after later steps) is merged into its step's record; one whose step has no
    record (cut off by a kill) stays a record of its own."""
    steps = {r.get("step"): r for r in records if not r.get("evaluation")}
    out = []
    for r in records:
        target = steps.get(r.get("step")) if r.get("evaluation") else None
        if target is None:
            out.append(r)
        else:
            target.update({k: v for k, v in r.items() if k not in ("step", "version", "evaluation", "elapsed_s")})
    return out


def _decode(record: dict) -> dict:
    """Turn the strings ``"nan"``, ``"inf"`` and ``"-inf"`` back into the floats the writer could not store."""
    return {k: NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in record.items()}


def _read_timeline(run: Run, path: Path) -> None:
    for rec in read_jsonl(path):
        try:
            if rec.get("type") == "span":
                run.spans.append(Span(rec["kind"], _number(rec, "t0"), _number(rec, "t1"), rec.get("step", -1)))
            elif rec.get("type") == "gen":
                run.gen.append(GenSample(_number(rec, "t"), _number(rec, "busy_s"), _number(rec, "generated_tokens")))
        except KeyError as e:
            raise ReportError(f"{path}: a {rec.get('type')} record lacks {e}") from None
        except TypeError as e:
            raise ReportError(f"{path}: a {rec.get('type')} record's {e}") from None
    run.gen.sort(key=lambda g: g.t)


def _number(record: dict, key: str) -> float:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"'{key}' must be a number, got {value!r:.40}")
    return value


def _read_config(path: Path) -> dict:
    try:
        return read_mapping(path)
    except ConfigError as e:
        raise ReportError(str(e)) from None


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of ``path``, one per line; a torn last line (a run killed or still writing, cut anywhere,
    even inside a character) is skipped."""
    lines = path.read_bytes().splitlines()
    out = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:  # ValueError: not JSON, not UTF-8 or a 5000-digit integer
            if n == len(lines):
                break
            what = (
                "not UTF-8 text"
                if isinstance(e, UnicodeDecodeError)
                else "nested too deeply"
                if isinstance(e, RecursionError)
                else "not JSON"
            )
            raise ReportError(f"{path}:{n}: {what} ({str(e):.200})") from None
        if not isinstance(record, dict):
            raise ReportError(f"{path}:{n}: a record must be a JSON object, got {type(record).__name__}")
        out.append(record)
    return out
