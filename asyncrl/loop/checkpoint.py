"""Checkpoints of a run, complete and atomic: ``RUN_DIR/checkpoints/stepN/`` and ``checkpoints/latest``.

``stepN/`` is a Hugging Face checkpoint (the policy and its tokenizer; ``critic/`` beside them), loadable with
``AutoModelForCausalLM``; with ``model.lora`` it holds the LoRA adapter instead (adapter_model.safetensors +
adapter_config.json, for ``peft.PeftModel.from_pretrained(base, stepN)``) and the merged model with its tokenizer
in ``stepN/merged/`` (``weights_dir``). Beside them, what a resumed run needs to go on as if nothing happened:

- ``trainer.pt``: the optimizer (of the adapters only, with LoRA) and schedule state, the RNG states (Python,
  NumPy, torch);
- ``run.json``: the version, the data position (items drawn from the prompt stream), the admission counters,
  the elapsed training time;
- ``rollouts.pt``: the groups that were finished but not yet trained (tokens, log-probs, per-token versions,
  rewards, admission versions) and the items still being rolled out (re-issued on resume; their partial
  tokens are dropped).

A checkpoint is written into a temporary directory beside the others, every file fsynced, then renamed to
``stepN`` and ``latest`` is replaced last (write + fsync + rename): a kill at any byte leaves the previous
checkpoint or the new one, never a half one that is loaded. The last ``keep`` checkpoints are kept. With
``background``, what a checkpoint holds is copied at the save and written by a thread while training goes on.

``manifest.json``, written last inside the checkpoint, holds the size and digest (BLAKE2b) of every file and the
SHA-256 of ``run.json``: :func:`verify` finds a checkpoint damaged later (a truncated, deleted or rewritten file,
whatever its size; an edited run state), and :func:`newest_valid` picks the newest checkpoint that verifies,
whatever ``latest`` says.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from asyncrl.api.trainer import Checkpointable, Snapshots
from asyncrl.trainer.state import cpu_copy

RUN_STATE = "run.json"
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer.pt"
ROLLOUTS = "rollouts.pt"
LATEST = "latest"


class CheckpointError(RuntimeError):
    """A checkpoint that could not be written (the previous one stays valid) or read."""


@dataclass
class RunState:
    """What the loop, the buffer and the rollout side need to continue."""

    version: int
    drawn: int = 0  # items taken from the prompt stream so far
    accepted: int = 0  # groups accepted (trained + waiting), for the staleness gate
    rejected: int = 0
    elapsed_s: float = 0.0  # training time before this checkpoint
    timeline_s: float = 0.0  # the timeline's clock at this checkpoint
    ready: list = field(default_factory=list)  # [(admit version, TrajectoryGroup)] finished, not trained
    inflight: list = field(default_factory=list)  # items being rolled out (re-issued on resume)
    staleness: dict | None = None  # where an auto η stands (``StalenessPolicy.state``); None in older checkpoints


class Checkpointer:
    """Writes ``trainer``'s checkpoints into ``run_dir/checkpoints``, keeping the last ``keep``.

    ``save(version, state, background=True)`` copies the weights, the training state and the RNGs now (the
    trainer's ``snapshot``) and writes them in a writer thread while training goes on; the next save, and
    ``wait()``, wait for it (a failed background write is raised there). Trainers that cannot copy their
    weights (``Snapshots`` not implemented or declined: FSDP shards, LoRA) are saved in the foreground."""

    def __init__(self, run_dir: Path, trainer: Checkpointable, tokenizer, keep: int = 3):
        self.dir, self.trainer, self.tokenizer = Path(run_dir) / "checkpoints", trainer, tokenizer
        self.keep = max(1, keep)
        self.last: int | None = None  # the version saved last (complete on disk)
        self._writer: threading.Thread | None = None
        self._failed: BaseException | None = None

    def save(self, version: int, state: RunState | None = None, background: bool = False) -> Path:
        """Write the checkpoint of ``version`` atomically and point ``latest`` at it (in a writer thread with
        ``background``: its path is returned before it is complete). Non-finite weights and a full disk are
        refused with ``CheckpointError``/``NonFiniteWeights``; the previous checkpoint stays."""
        self.wait()
        weights = self.trainer.snapshot() if background and isinstance(self.trainer, Snapshots) else None
        if weights is None:
            self.trainer.check_finite()
            self._write(
                version,
                lambda d: self.trainer.save(d, self.tokenizer),
                lambda d: training_state(self.trainer, d),
                state,
            )
        else:
            trained = cpu_copy(training_state(self.trainer))  # the optimizer and the RNGs as they are now
            self._writer = threading.Thread(
                target=self._write_in_background,
                name=f"checkpoint-{version}",
                args=(version, lambda d: weights.save(d, self.tokenizer), lambda d: trained, state),
                daemon=True,
            )
            self._writer.start()
        return self.dir / f"step{version}"

    def wait(self) -> None:
        """Until the background write in progress, if any, is complete; raises its failure."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    @property
    def writing(self) -> bool:
        return self._writer is not None and self._writer.is_alive()

    def _write_in_background(self, *args) -> None:
        try:
            self._write(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread by wait()
            self._failed = e

    def _write(self, version: int, write_weights, trained, state: RunState | None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / f"step{version}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step{version}-", dir=self.dir))
        try:
            write_weights(str(tmp))
            if state is not None:
                torch.save(trained(tmp), tmp / TRAINER_STATE)
                torch.save({"ready": state.ready, "inflight": state.inflight}, tmp / ROLLOUTS)
                _write_json(
                    tmp / RUN_STATE,
                    {
                        k: getattr(state, k)
                        for k in ("version", "drawn", "accepted", "rejected", "elapsed_s", "timeline_s", "staleness")
                    },
                )
            _write_json(tmp / MANIFEST, manifest(tmp))
            _fsync_tree(tmp)
            if final.exists():  # the same version again (e.g. saved at the end of a resumed run)
                _remove(final)
            os.rename(tmp, final)
            _fsync_dir(self.dir)
            _write_json(self.dir / LATEST, None, text=final.name + "\n")
        except Exception as e:  # OSError, and the writers' own errors (safetensors' SafetensorError, torch.save's
            # RuntimeError on a full disk)
            why = (
                "the disk is full"
                if _disk_full(e, tmp)
                else (getattr(e, "strerror", None) or f"{type(e).__name__}: {e}")
            )
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"writing the checkpoint of version {version} in {self.dir} failed: {why}; "
                f"the previous checkpoint ({read_latest(self.dir) or 'none'}) stays valid"
            ) from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.last = version
        self._prune()

    def _prune(self) -> None:
        """Keep the ``keep`` newest checkpoints up to the one just written; one numbered above it is left from
        before a resume (a damaged one the resume skipped, or one of steps this run trains again): it goes, or it
        would count among the newest and have the checkpoint just written pruned."""
        steps = sorted(
            (p for p in self.dir.glob("step[0-9]*") if p.is_dir() and p.name[4:].isdigit()),
            key=lambda p: int(p.name[4:]),
        )
        ahead = [p for p in steps if self.last is not None and int(p.name[4:]) > self.last]
        kept = [p for p in steps if p not in ahead]
        for old in ahead + kept[: -self.keep]:
            _remove(old)
        for stale in self.dir.glob(".tmp-step*"):  # left by a run killed while saving or removing
            shutil.rmtree(stale, ignore_errors=True)


def _remove(checkpoint: Path) -> None:
    """Delete a checkpoint directory: renamed out of the resume's sight first (one step), then removed, so that a
    kill in the middle never leaves a half-deleted ``stepN`` that a resume would take (its manifest gone first, it
    read as a checkpoint from before manifests, without its weights). A later prune removes what is left."""
    doomed = checkpoint.with_name(f".tmp-step-removed-{checkpoint.name}-{os.getpid()}")
    try:
        os.rename(checkpoint, doomed)
    except OSError:
        doomed = checkpoint
    shutil.rmtree(doomed, ignore_errors=True)


def _disk_full(e: BaseException, directory: Path) -> bool:
    """Whether a failed write ran out of disk: its errno or message says so, or (torch.save says only "file write
    failed") less than 4 MiB is free beside the half-written checkpoint."""
    if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e):
        return True
    try:
        return shutil.disk_usage(directory).free < 4 << 20
    except OSError:
        return False


def training_state(trainer, directory: Path | None = None) -> dict:
    """The optimizer and the RNGs, for an exact resume (FSDP ranks write their optimizer shards to
    ``directory``)."""
    return {
        "trainer": trainer.training_state(None if directory is None else str(directory)),
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
    }


def restore_training_state(trainer, path: Path) -> None:
    state = torch.load(path / TRAINER_STATE, weights_only=False)
    trainer.load_training_state(state["trainer"], str(path))
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def weights_dir(checkpoint: Path | str) -> str:
    """The Hugging Face directory of a checkpoint's policy weights: the checkpoint itself, or the merged export
    of a LoRA checkpoint (whose adapter alone needs the base model)."""
    from asyncrl.models.lora import MERGED_DIR, is_adapter_dir

    return str(Path(checkpoint) / MERGED_DIR) if is_adapter_dir(checkpoint) else str(checkpoint)


def read_latest(checkpoints: Path) -> str | None:
    """The checkpoint name ``latest`` holds, if it names a checkpoint directory of ``checkpoints`` (a garbled,
    empty or outside-pointing ``latest`` names none)."""
    try:
        name = (Path(checkpoints) / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not name.startswith("step") or not name[4:].isdigit():
        return None
    return name if (Path(checkpoints) / name / RUN_STATE).is_file() else None


def run_version(checkpoint: Path) -> int:
    """The version a checkpoint holds, from its run state alone (the rollouts are not loaded)."""
    return json.loads((Path(checkpoint) / RUN_STATE).read_text())["version"]


def manifest(directory: Path) -> dict:
    """Every file under ``directory`` with its size and digest (BLAKE2b), and the SHA-256 of its run state."""
    files = {
        str(p.relative_to(directory)): [p.stat().st_size, digest(p)]
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    state = directory / RUN_STATE
    return {"files": files, RUN_STATE: _sha256(state) if state.is_file() else None}


def verify(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (a missing or truncated file, an edited run state, a version
    that is not its name's), or None when it verifies. A checkpoint of an older asyncrl without a manifest is
    checked for its files only."""
    checkpoint = Path(checkpoint)
    if not (checkpoint / RUN_STATE).is_file():
        return f"{RUN_STATE} is missing"
    try:
        version = run_version(checkpoint)
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        return f"{RUN_STATE} cannot be read ({type(e).__name__})"
    if checkpoint.name != f"step{version}":
        return f"{RUN_STATE} says version {version!r}, not {checkpoint.name[4:]}"
    try:
        saved = json.loads((checkpoint / MANIFEST).read_text())
    except FileNotFoundError:
        missing = [f for f in (TRAINER_STATE, ROLLOUTS) if not (checkpoint / f).is_file()]
        return f"{', '.join(missing)} missing" if missing else None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{MANIFEST} cannot be read ({type(e).__name__})"
    files = saved.get("files") if isinstance(saved, dict) else None
    if not isinstance(files, dict):
        return f"{MANIFEST} is not a manifest (no 'files' object)"
    for name, written in files.items():
        path = checkpoint / name
        size, written_digest = written if isinstance(written, list) and len(written) == 2 else (written, None)
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, not the {size} written"
        if written_digest is not None and digest(path) != written_digest:  # manifests before digests: sizes only
            return f"{name} was changed after it was written (its digest differs)"
    if saved.get(RUN_STATE) != _sha256(checkpoint / RUN_STATE):
        return f"{RUN_STATE} was changed after it was written"
    return None


def newest_valid(checkpoints: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from: the newest ``stepN`` that verifies (``latest`` names it, unless the run
    was killed between the rename and ``latest``, or ``latest`` was damaged); and a line for each newer one
    skipped, with why."""
    steps = sorted(
        (p for p in Path(checkpoints).glob("step*") if p.is_dir() and p.name[4:].isdigit()),
        key=lambda p: int(p.name[4:]),
        reverse=True,
    )
    skipped = []
    for step in steps:
        why = verify(step)
        if why is None:
            return step, skipped
        skipped.append(f"{step.name}: {why}")
    return None, skipped


def digest(path: Path) -> str:
    """A file's BLAKE2b-128 digest, read in 4 MiB chunks (fast enough to take at every save and resume)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_run_state(path: Path) -> RunState:
    """The run state of checkpoint ``path`` (a directory written by ``Checkpointer.save``)."""
    try:
        meta = json.loads((path / RUN_STATE).read_text())
        rollouts = torch.load(path / ROLLOUTS, weights_only=False)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} cannot be read ({e})") from e
    return RunState(**meta, ready=rollouts["ready"], inflight=rollouts["inflight"])


# ---- durable writes -----------------------------------------------------------------------------------------
def _write_json(path: Path, obj, text: str | None = None) -> None:
    """``path`` replaced atomically: written beside it, fsynced, renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text if text is not None else json.dumps(obj))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
