"""An SFT run's step checkpoints and their resumption: ``OUTPUT/stepN`` is a loadable checkpoint plus
``sft_state.pt`` (the trained weights, optimizer, data position and RNG), written aside and renamed into place;
``resume=auto`` continues from the newest one when the configuration matches. ``OUTPUT/best`` is the model of the
best held-out evaluation so far (``best.json``: its step and accuracy)."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import torch

from asyncrl import configlib
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError

METRICS_FILE = "sft_metrics.jsonl"  # OUTPUT/sft_metrics.jsonl: a record per step
STATE_FILE = "sft_state.pt"  # in a step checkpoint: what a resume needs beyond the weights
BEST_DIR, BEST_FILE = "best", "best.json"  # OUTPUT/best: the model of the best held-out evaluation so far
RESUME_SETTABLE = (
    "output_dir",
    "total_train_steps",
    "log_every",
    "evaluator.",
    "saver.",
    "progress_bar",
    "resume",
    "actor.threads",
)
"""Keys a resumed SFT run may change: how long it runs and how it is watched, evaluated, saved and threaded."""


def _step_points(out: Path) -> list[Path]:
    return sorted(
        (p for p in out.glob("step*") if (p / STATE_FILE).is_file() and p.name[4:].isdigit()),
        key=lambda p: int(p.name[4:]),
    )


def start_over(out: Path, model_path: str = "") -> None:
    """Before a run that starts over in ``out``: an earlier run's step checkpoints there are moved aside with
    everything else of it (to ``<out>.replaced-<time>``), so that a later ``resume=auto`` cannot continue the
    earlier run under the new one's name. Refused (ConfigError) when the model to train from (``model_path``)
    is in ``out``: it would be moved away from under the run."""
    if not _step_points(out):
        return
    out = out.resolve()  # output_dir=. has no name of its own
    model = Path(model_path).resolve() if model_path and Path(model_path).exists() else None  # not a hub name
    if model is not None and (model == out or out in model.parents):
        raise ConfigError(
            f"model.path '{model_path}' is inside output_dir '{out}', which holds an earlier SFT run "
            "that starting over moves aside: write this run to another output_dir"
        )
    aside = out.with_name(f"{out.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    aside.mkdir()
    for entry in out.iterdir():  # its contents, not the directory: it may be the working directory
        shutil.move(str(entry), str(aside / entry.name))
    logging.getLogger(__name__).warning("starting %s afresh; the earlier run there is kept in %s", out, aside)


def resume_point(cfg: SFTConfig, out: Path) -> Path | None:
    """The newest step checkpoint of ``out`` to resume from (resume=auto), or None to start over. A run whose
    configuration differs in a key that changes what is trained is refused, with the keys named."""
    if cfg.resume == "fresh":
        return None
    points = _step_points(out)
    if not points:
        return None
    try:
        saved = configlib.read_mapping(out / "sft_config.yaml")
    except ConfigError as e:
        raise ConfigError(
            f"cannot read {out / 'sft_config.yaml'} of the run to resume: {e}; set resume=fresh to start over"
        ) from e
    a, b = configlib.flat(saved), configlib.flat(configlib.to_dict(cfg))
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not k.startswith(RESUME_SETTABLE)]
    if changed:
        raise ConfigError(
            f"{out} holds an SFT run with another configuration ("
            + "; ".join(f"{k}: {a.get(k)} -> {b.get(k)}" for k in changed[:8])
            + "): resume it with the same keys, or set resume=fresh to start over"
        )
    return points[-1]


def save_step(model, tokenizer, optimizer, examples, out: Path, step: int, lora: bool, keep_last: int = 0) -> None:
    """``out/stepN``: a loadable checkpoint and the state a resume needs, written aside and renamed into place;
    with ``keep_last``, the older step checkpoints beyond that many are removed once it is in place."""
    final, tmp = out / f"step{step}", out / f".step{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp, lora)
    torch.save(
        {
            "step": step,
            "trained": {n: p.detach() for n, p in model.named_parameters() if p.requires_grad},
            "optimizer": optimizer.state_dict(),
            "items_read": examples.items_read,
            "counts": dict(examples.counts),
            "rng": torch.get_rng_state(),
        },
        tmp / STATE_FILE,
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if keep_last > 0:
        for older in _step_points(out)[:-keep_last]:
            shutil.rmtree(older, ignore_errors=True)


def evaluation_key(cfg: SFTConfig) -> dict:
    """The settings a held-out accuracy depends on that a resumed run may change: accuracies measured under other
    ones are not compared."""
    return {"greedy": cfg.evaluator.greedy, "success_threshold": cfg.evaluator.success_threshold}


def save_best(model, tokenizer, out: Path, step: int, accuracy: float, lora: bool, evaluation: dict) -> None:
    """``out/best``: the model of step ``step``, whose held-out accuracy is the best so far, written aside and
    renamed into place (loadable as ``out`` is; ``best.json`` says which step, what accuracy, and under which
    ``evaluation_key``)."""
    final, tmp = out / BEST_DIR, out / f".{BEST_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp, lora)
    (tmp / BEST_FILE).write_text(json.dumps({"step": step, "eval_accuracy": accuracy, "evaluation": evaluation}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def best_before(out: Path, first: int, evaluation: dict | None = None) -> dict | None:
    """``out/best``'s ``best.json`` when it was saved before step ``first`` (a resumed run keeps it); one saved at
    or after ``first`` (steps a resumed run trains again, or a run started over) is removed. One evaluated under
    another ``evaluation`` stays on disk but is not returned: the next evaluation replaces it, whatever its
    accuracy (the two are not comparable)."""
    try:
        best = json.loads((out / BEST_DIR / BEST_FILE).read_text())
        if int(best["step"]) < first:
            if evaluation is not None and best.get("evaluation", evaluation) != evaluation:
                logging.getLogger(__name__).warning(
                    "%s was evaluated with %s, this run evaluates with %s: its accuracy %.3f is not compared, and "
                    "the next evaluation replaces it",
                    out / BEST_DIR,
                    best.get("evaluation"),
                    evaluation,
                    best["eval_accuracy"],
                )
                return None
            return best
    except (OSError, ValueError, KeyError, TypeError):
        pass
    shutil.rmtree(out / BEST_DIR, ignore_errors=True)
    return None


def restore(point: Path, model, optimizer, examples) -> int:
    """Load a step checkpoint's state into the model, the optimizer and the example stream; its step."""
    state = torch.load(point / STATE_FILE, weights_only=False)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["trained"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    examples.skip(state["items_read"])
    examples.counts.update(state["counts"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def save_model(model, tokenizer, path: Path, lora: bool) -> None:
    if lora:
        from asyncrl.models.lora import save_lora

        save_lora(model, path, tokenizer)
        return
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
