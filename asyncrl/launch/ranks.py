"""Several trainer ranks behind the one-trainer interface the loop uses.

Rank 0 owns the whole rollout side (engine, buffer, rollout thread, evaluation, publishing, checkpoints) and a
``RankedTrainer``: each step it splits the batch into one shard per rank (whole groups, balanced by tokens),
hands the shards out, trains on its own, and collects the statistics; the other ranks run ``serve_rank`` and
do the same step on theirs. The loop and everything else see a trainer with ``step``, ``state_dict``, ``save``.

``spawn_ranks`` starts ranks 1..N-1 of a local run as child processes of rank 0 (the ``local`` launcher), with
the standard ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` environment, so ``torchrun`` can start
the same command instead.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import fields, replace

import torch

from asyncrl.cluster.parallel import DataParallel, shard_groups
from asyncrl.engine.spawn import die_with_parent
from asyncrl.types import Batch

log = logging.getLogger(__name__)

RANK_ENV = "ASYNCRL_RAY_RANK"
"""Set (to the rank) in the trainer processes the Ray launcher starts: ``train()`` there runs that rank."""
RESUME_ENV = "ASYNCRL_RESUME"
"""Set by the process that starts the other ranks: the checkpoint every rank resumes from ("" = none)."""
SUMMED = ("loss", "train_tokens", "train_positions", "value_loss")
TAKEN_FROM_RANK_0 = ("grad_norm", "lr", "critic_grad_norm", "train_recompute_s", "train_fwd_bwd_s", "train_optim_s")
MAXIMUM = ("train_time_s", "nonfinite_skipped")


def split(batch: Batch, world: int) -> list[Batch]:
    """One shard per rank: whole groups, balanced by tokens, each trimmed to its own longest row."""
    groups = batch.group_ids.unique().tolist()
    tokens = [int(batch.attention_mask[batch.group_ids == g].sum()) for g in groups]
    shards = []
    for members in shard_groups(tokens, world):
        rows = torch.cat([(batch.group_ids == groups[i]).nonzero().flatten() for i in members])
        T = int(batch.attention_mask[rows].sum(-1).max())
        full = batch.input_ids.shape[1]
        shards.append(Batch(**{f.name: _rows(getattr(batch, f.name), rows, T, full) for f in fields(Batch)}))
    return shards


def _rows(x: torch.Tensor, rows: torch.Tensor, T: int, full: int) -> torch.Tensor:
    """The rows of ``x`` cut to width T (token arrays) or T - 1 (target arrays, one shorter)."""
    x = x[rows]
    if x.dim() == 1:
        return x
    return x[:, :T] if x.shape[1] == full else x[:, : T - 1]


def combine(stats: list[dict]) -> dict:
    """The step's statistics over ranks: sums of shares (loss, tokens), maxima, rank 0's value of what every
    rank shares (the gradient norm), token-weighted means of the rest."""
    weights = [s.get("train_tokens", 1) for s in stats]
    total = sum(weights) or 1
    out = {}
    for key in stats[0]:
        values = [s.get(key, 0.0) for s in stats]
        if key in SUMMED:
            out[key] = sum(values)
        elif key in TAKEN_FROM_RANK_0:
            out[key] = values[0]
        elif key in MAXIMUM or key.endswith("_max"):
            out[key] = max(values)
        else:
            out[key] = sum(v * w for v, w in zip(values, weights)) / total
    return out


class RankedTrainer:
    """Rank 0's trainer when there are several ranks."""

    def __init__(self, trainer, dp: DataParallel):
        self.trainer, self.dp = trainer, dp
        self.algo = trainer.algo

    @property
    def steps_done(self) -> int:
        return self.trainer.steps_done

    def step(self, batch: Batch, version: int = 0) -> dict:
        shards = split(batch, self.dp.world)
        _, mine, _ = self.dp.scatter([("step", shard, version) for shard in shards])
        stats = combine(self.dp.gather(self.trainer.step(mine, version)))
        self.trainer.gather_weights()
        return stats

    def training_state(self, directory: str | None = None) -> dict:
        """The optimizer state (FSDP: every rank is told to take part: to write its shard to ``directory``, a
        path all ranks see, or to gather it to rank 0)."""
        if self.dp.fsdp:
            self.dp.scatter([("state", directory, None)] * self.dp.world)
        return self.trainer.training_state(directory)

    def state_dict(self):
        return self.trainer.state_dict()

    def save(self, path: str, tokenizer=None) -> None:
        self.trainer.save(path, tokenizer)

    def check_finite(self) -> None:
        self.trainer.check_finite()

    def close(self) -> None:
        """Tell the other ranks to stop (best effort: where a rank died, the group is broken and nobody listens)."""
        try:
            self.dp.scatter([None] * self.dp.world)
        except RuntimeError as e:  # gloo's "Connection reset by peer": the run is already ending with the cause
            log.warning("could not tell the other trainer ranks to stop: %s", str(e).splitlines()[0][:200])


def serve_rank(trainer, dp: DataParallel) -> None:
    """Ranks 1..N-1: train on each shard rank 0 hands out, until it says stop."""
    while True:
        message = dp.scatter(None)
        if message is None:
            return
        kind, shard, version = message
        if kind == "state":
            trainer.training_state(shard)  # the checkpoint's directory
            continue
        dp.gather(trainer.step(shard, version))
        trainer.gather_weights()


class RankDied(RuntimeError):
    """A trainer rank process died during the run (the collective that failed on rank 0 is only its symptom)."""


class LocalRanks:
    """Ranks 1..N-1 of this run as child processes, ended with it."""

    def __init__(self, procs: list[subprocess.Popen], config_file: str):
        self.procs, self.config_file = procs, config_file

    def close(self, timeout_s: float = 30.0) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        os.unlink(self.config_file)

    def failed(self, grace_s: float = 0.0) -> list[int]:
        """The exit statuses of ranks that died. ``grace_s``: a failed collective can show a killed rank's closed
        socket before the rank can be reaped; wait up to that long for it."""
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.returncode for p in self.procs if p.poll() not in (None, 0)]


def spawn_ranks(cfg, world: int, port: int, resume=None) -> LocalRanks:
    """Start ranks 1..world-1 running ``asyncrl train`` with this run's resolved config, and make this process
    rank 0 (the environment torchrun would set). They die with this process (parent-death signal)."""
    from asyncrl import configlib

    fd, path = tempfile.mkstemp(prefix="asyncrl-rank-config-", suffix=".yaml")
    os.close(fd)
    configlib.dump(replace(cfg, progress_bar=False), path, mask_secrets=False)  # the ranks are this run
    env = {
        **os.environ,
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        RESUME_ENV: str(resume or ""),
    }
    os.environ.update(
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "asyncrl.cli", "train", "--config", path],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            preexec_fn=die_with_parent(),
        )
        for r in range(1, world)
    ]
    return LocalRanks(procs, path)
