"""The asynchronous train loop over the built parts of a run (``Parts``).

Two halves run at the same time:

- **generation**, in its own threads, started by ``Parts.start_generation``: the engine decodes every running
  request; the rollout loop (``asyncrl.loop.rollout.RolloutRunner``) admits item after item through the staleness
  gate of the buffer (``RolloutBuffer.try_admit``: a group may start while
  ``accepted + running < (max_staleness + version + 1) * batch_size``), runs ``workflow.run(item, engine)``
  for each as a task of its own, and puts each finished group into the buffer (``RolloutBuffer.finish``);
- **training**, in this thread (``run``): take B groups as soon as they are ready (``RolloutBuffer.take``,
  oldest admission first, so no trained token is more than ``max_staleness`` versions old), train on them,
  publish the new weights to the engine (in-flight requests continue under them), raise the version (which
  opens the gate for B more groups), log, evaluate and save when due. Before the first rollout the engine is
  given the run's own weights at its start version (a resumed run's), so every token is stamped truly.

The parts are built by ``asyncrl.launch.build.assemble`` and run by ``asyncrl.launch.train``; this module only
runs them, and knows them by their Protocols.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from asyncrl.api.engine import Engine
from asyncrl.api.staleness import StalenessPolicy
from asyncrl.api.trainer import Trainer
from asyncrl.api.weights import Publisher
from asyncrl.data.collate import collate
from asyncrl.loop.buffer import RolloutBuffer
from asyncrl.loop.checkpoint import Checkpointer, CheckpointError, RunState
from asyncrl.loop.evaluate import BackgroundEvaluator
from asyncrl.loop.rollout import RolloutRunner
from asyncrl.telemetry.metrics import MetricsLogger, StepMeter
from asyncrl.telemetry.timeline import Timeline
from asyncrl.telemetry.watchdog import Watchdog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopPlan:
    """The loop's settings as plain values."""

    total_steps: int
    max_time_s: float  # 0 = no limit
    batch_timeout_s: float
    eval_every: int  # 0 = only at the start and the end
    save_every: int  # 0 = by time, and at the end
    save_every_s: float  # 0 = not by time
    stop_if_unsaved: bool  # a checkpoint that cannot be written stops the run
    pad_id: int
    save_in_background: bool = False  # checkpoints written by a writer thread while training goes on

    def evaluate_at(self, version: int) -> bool:
        return bool(self.eval_every) and version % self.eval_every == 0

    def save_at(self, version: int, since_last_save_s: float) -> bool:
        return (bool(self.save_every) and version % self.save_every == 0) or (
            bool(self.save_every_s) and since_last_save_s >= self.save_every_s
        )

    def out_of_time(self, elapsed_s: float) -> bool:
        return bool(self.max_time_s) and elapsed_s >= self.max_time_s


@dataclass
class Parts:
    """Everything the loop runs on, built and closed by ``asyncrl.launch.build.assemble``."""

    run_dir: Path
    plan: LoopPlan
    trainer: Trainer
    engine: Engine  # the rollout engine (started)
    publisher: Publisher  # new weights -> the engine
    buffer: RolloutBuffer  # the staleness gate and the finished groups
    staleness: StalenessPolicy  # η: fixed, or tuned from each step's record
    rollout: RolloutRunner  # admission and one workflow task per group, in the rollout thread
    evaluate: Callable[[int], dict]  # held-out metrics of a version (asyncrl.loop.evaluate.Evaluator)
    checkpoints: Checkpointer
    logger: MetricsLogger
    timeline: Timeline
    meter: StepMeter
    watchdog: Watchdog
    start: RunState  # where the run starts (version 0, or a checkpoint's)
    background_eval: BackgroundEvaluator | None = None  # evaluations beside training (evaluator.background)

    def start_generation(self) -> None:
        """Generation begins: admission opens, the timeline samples the engine, rates count from now."""
        self.rollout.start()
        self.timeline.start()
        self.meter.start(self.start.elapsed_s)

    def save(self, version: int) -> None:
        """A complete checkpoint of ``version``: the weights and the trainer's state (optimizer, RNGs), and the
        rollout side's: the groups finished but not trained, the items in flight, the data position and the
        admission counters (``RunState``)."""
        self.saved()  # the previous checkpoint is complete (or its failure said) before this one is taken
        snap = self.buffer.snapshot()
        state = RunState(
            version,
            snap.drawn,
            snap.accepted,
            snap.rejected,
            self.meter.elapsed(),
            self.timeline.now(),
            snap.ready,
            snap.inflight,
            self.staleness.state(),
        )
        self._checked(lambda: self.checkpoints.save(version, state, background=self.plan.save_in_background))
        self.meter.last_save = self.meter.elapsed()

    def saved(self) -> None:
        """Until the checkpoint being written in the background, if any, is complete."""
        self._checked(self.checkpoints.wait)

    def _checked(self, save: Callable[[], object]) -> None:
        try:
            save()
        except CheckpointError as e:  # this checkpoint's, or the previous background write's
            if self.plan.stop_if_unsaved:
                raise
            newest = f"step{self.checkpoints.last}" if self.checkpoints.last else "none"
            log.warning("a checkpoint was not written (saver.on_error=continue; the newest is %s): %s", newest, e)


def run(p: Parts) -> dict:
    """Train from ``p.start`` to the planned number of steps (or time); returns the last metrics record. A
    failure, the watchdog or a signal (``StopRequested``) ends the loop with a checkpoint of the last weights
    trained, if they are finite and not saved already."""
    try:
        return _loop(p)
    except Exception:
        save_last(p)
        raise


def _loop(p: Parts) -> dict:
    """The loop: one batch, one ``Trainer.step`` (``actor.ppo_n_minibatches`` optimizer steps), one new
    version per iteration."""
    plan, tl, record = p.plan, p.timeline, {}
    if p.start.version == 0:
        with tl.span("eval", 0):
            record = {"step": 0, "version": 0, **p.evaluate(0)}
        p.logger.log(record)
        p.watchdog.evaluated(record)
    with tl.span("sync", p.start.version):  # every engine, attached servers too, serves this run's policy
        p.publisher.publish(p.trainer.state_dict(), p.start.version)
    p.start_generation()
    for step in range(p.start.version, plan.total_steps):
        with tl.span("wait", step) as waited:
            groups = p.buffer.take(plan.batch_timeout_s)  # raises the rollout side's failure at once
        with tl.span("train", step):
            batch = collate(groups, plan.pad_id)
            stats = p.trainer.step(batch, version=step)
        version = step + 1
        with tl.span("sync", step):
            try:
                sync_s = p.publisher.publish(p.trainer.state_dict(), version)
            except Exception:  # e.g. every server lost: the step trained, so it is logged and its weights saved
                p.logger.log(
                    {**p.meter.record(version, groups, batch, stats, 0.0, waited.seconds), "publish_failed": 1}
                )
                raise
        p.buffer.set_version(version)  # the staleness gate opens for B more groups
        with tl.span("log", step):
            record = p.meter.record(version, groups, batch, stats, sync_s, waited.seconds)
            p.staleness.observe(record)  # an auto η reads where the step's time went
        final = version == plan.total_steps or plan.out_of_time(p.meter.elapsed())
        if final or plan.evaluate_at(version):
            with tl.span("eval", version):
                if p.background_eval is not None:
                    log_evaluations(p, p.background_eval.finished(wait=True))  # one at a time, on one engine
                if p.background_eval is not None and not final:
                    p.background_eval.start(version, record["elapsed_s"])  # these weights, scored beside training
                else:
                    record.update(p.evaluate(version))
        with tl.span("log", step):
            p.logger.log(record)  # before the checkpoint: a resume cuts the logs back to it, never leaves a hole
            if p.background_eval is not None:
                log_evaluations(p, p.background_eval.finished())
            p.watchdog.check(record)  # may stop the run: its last version is saved all the same (save_last)
        if final or plan.save_at(version, p.meter.elapsed() - p.meter.last_save):
            with tl.span("save", version):
                p.save(version)  # with saver.background: a copy now, written while the next steps train
        if final:
            break
    with tl.span("save", record.get("version", 0)):
        p.saved()
    log.info("trained up to version %s in %.0f s", record.get("version"), p.meter.elapsed())
    return record


def log_evaluations(p: Parts, done: list[tuple[int, float, dict]]) -> None:
    """Evaluations that ended beside training, each logged against its version (readers merge it into that
    step's record)."""
    for version, elapsed_s, metrics in done:
        record = {"step": version, "version": version, "evaluation": True, "elapsed_s": elapsed_s, **metrics}
        p.logger.log(record)
        p.watchdog.evaluated(record)


def save_last(p: Parts) -> None:
    """A checkpoint of the weights the run stops with, if they are those of the last step logged and not saved
    already (refused, and said, if they are not finite); then an evaluation running beside training is waited for
    and logged (a resumed run does not evaluate the version it starts from again). The checkpoint goes first: a
    second signal, or a scheduler's kill after its grace period, may not wait for a whole evaluation."""
    try:
        p.saved()  # a background write in progress completes first
    except Exception as e:  # noqa: BLE001 - the reason the run stopped matters more
        log.error("the run stops: the checkpoint being written failed: %s", e)
    _save_stopping_version(p)
    if p.background_eval is not None:
        try:
            log_evaluations(p, p.background_eval.finished(wait=True))
        except Exception as e:  # noqa: BLE001 - the reason the run stopped matters more
            log.error("the run stops: the evaluation running beside training failed: %s", e)


def _save_stopping_version(p: Parts) -> None:
    version = p.trainer.steps_done
    if version == 0 or p.checkpoints.last == version or p.logger.last_step != version:
        return
    try:
        p.save(version)
        p.saved()
        log.info("the run stops: checkpoint of version %d saved", version)
    except Exception as e:  # noqa: BLE001 - the reason the run stopped matters more
        log.error("the run stops: no checkpoint of version %d: %s", version, e)
