"""The asynchronous train loop: admit -> rollout -> buffer -> train -> publish.

Generation runs continuously in its own threads (the engine loop and the rollout event loop); this thread
trains on each batch as soon as it is ready, publishes the new weights (in-flight requests continue under
them) and raises the version, which opens the staleness gate for more prompts.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from asyncrl import configlib
from asyncrl.algo import build_group_filter
from asyncrl.buffer import RolloutBuffer
from asyncrl.config import TrainConfig
from asyncrl.data import build_dataset
from asyncrl.data.collate import collate
from asyncrl.engine import build_engine, build_publisher
from asyncrl.engine.local import LocalEngine
from asyncrl.evaluate import evaluate
from asyncrl.metrics import MetricsLogger, summary_line
from asyncrl.models import DTYPES, load_model, load_tokenizer, resolve_model_path
from asyncrl.reward import build_reward_service
from asyncrl.rollout import RolloutRunner
from asyncrl.timeline import Timeline
from asyncrl.trainer import build_trainer
from asyncrl.types import SamplingParams, WeightUpdate
from asyncrl.workflow.rlvr import RLVRWorkflow

log = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> dict:
    """Run RL training as configured; returns the last metrics record."""
    run = _Run(cfg)
    try:
        return run.loop()
    finally:
        run.close()
        if cfg.report:
            _write_report(run.dir)


def _write_report(run_dir) -> None:
    from asyncrl.report import write_report

    try:
        log.info("run report: %s", write_report(run_dir))
    except Exception as e:  # a finished run never fails for its report
        log.warning("no run report: %s", e)


class _Run:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.actor.threads)
        self.dir = Path(cfg.output_dir) / cfg.experiment_name / cfg.trial_name
        self.dir.mkdir(parents=True, exist_ok=True)
        configlib.dump(cfg, self.dir / "config.yaml")
        model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(model_path)
        model = load_model(model_path)  # master weights in float32; model.dtype sets compute dtype
        data = build_dataset(cfg.task, cfg.train_dataset, cfg.valid_dataset, tokenizer=self.tokenizer)
        self.valid, self.data_stats = data.valid, data.stats
        self.reward = build_reward_service(cfg.reward, data.reward_fn)
        g = cfg.gconfig
        eos = (self.tokenizer.eos_token_id,)
        self.sampling = SamplingParams(n=g.n_samples, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                                       top_p=g.top_p, top_k=g.top_k, stop_token_ids=eos)
        self.eval_params = SamplingParams(max_new_tokens=g.max_new_tokens, greedy=cfg.evaluator.greedy,
                                          temperature=g.temperature, stop_token_ids=eos)
        max_len = min(model.config.max_position_embeddings, 1024)
        dtype = DTYPES[cfg.model.dtype]
        self.engine = build_engine(cfg.rollout, model, model_path=model_path, dtype=dtype,
                                   max_len=max_len, seed=cfg.seed, stop_token_ids=eos)
        self.eval_engine = LocalEngine(model, max_slots=cfg.rollout.max_slots, max_len=max_len, dtype=dtype,
                                       seed=cfg.seed + 1, stop_token_ids=eos,
                                       native_kernels=cfg.rollout.native_kernels)
        self.trainer = build_trainer(cfg.actor, model, model_path=model_path, temperature=g.temperature,
                                     autocast_dtype=None if cfg.model.dtype == "float32" else dtype,
                                     max_new_tokens=g.max_new_tokens)
        self.publisher = build_publisher(cfg.rollout, [self.engine])
        self.buffer = RolloutBuffer(cfg.train_dataset.batch_size, cfg.rollout.max_head_offpolicyness,
                                    cfg.rollout.max_concurrent_rollouts)
        self.workflow = RLVRWorkflow(self.tokenizer, self.reward, self.sampling)
        self.rollout = RolloutRunner(self.engine, self.buffer, self.workflow, data.train, cfg.rollout.request_timeout_s,
                                     accept=build_group_filter(cfg.actor))
        self.logger = MetricsLogger(self.dir, cfg.stats_logger, f"{cfg.experiment_name}/{cfg.trial_name}",
                                    configlib.to_dict(cfg))
        self.timeline = Timeline(self.dir / "timeline.jsonl", self.engine.stats)

    def loop(self) -> dict:
        cfg, version, tl = self.cfg, 0, self.timeline
        with tl.span("eval", 0):
            record = {"step": 0, "version": 0, **self._evaluate(version)}
        self.logger.log(record)
        log.info("start | %s", summary_line(record))
        self.engine.start()
        self.rollout.start()
        tl.start()
        bar = _progress(cfg)
        t_start = last = free = time.perf_counter()  # last: end of the previous step; free: trainer idle since
        last_gen, last_busy = self._engine_counters()
        for step in range(cfg.total_train_steps):
            with tl.span("wait", step):
                groups = self.buffer.take(timeout=cfg.rollout.request_timeout_s)
            t_ready = time.perf_counter()
            batch = collate(groups, self.tokenizer.pad_token_id)
            with tl.span("train", step):
                stats = self.trainer.step(batch, version=step)
            version = step + 1
            with tl.span("sync", step):
                sync_s = self.publisher.publish(self.trainer.state_dict(), version)
            self.buffer.set_version(version)
            now = time.perf_counter()
            gen, busy = self._engine_counters()
            record = {
                "step": version, "version": version, **_batch_stats(batch, version - 1),
                "gen_tokens_per_s": (gen - last_gen) / (now - last),
                "gen_busy_frac": (busy - last_busy) / (now - last),
                "train_tokens_per_s": stats["train_tokens"] / stats["train_time_s"],
                "trainer_wait_s": t_ready - free, "weight_sync_s": sync_s, "step_time_s": now - last,
                "elapsed_s": now - t_start, "rollout_failures": self.rollout.failures,
                "groups_filtered": self.rollout.filtered,
                "interruptions": self.engine.stats()["interruptions"], **self.reward.stats(),
                **self.buffer.stats(), **self.data_stats(), **stats,
            }
            timed_out = cfg.max_train_time_s and now - t_start >= cfg.max_train_time_s
            final = version == cfg.total_train_steps or timed_out
            if final or (cfg.evaluator.freq_steps and version % cfg.evaluator.freq_steps == 0):
                with tl.span("eval", version):
                    record.update(self._evaluate(version))
            if final or (cfg.saver.freq_steps and version % cfg.saver.freq_steps == 0):
                with tl.span("save", version):
                    self._save(version)
            last, last_gen, last_busy, free = now, gen, busy, time.perf_counter()
            self.logger.log(record)
            _report(bar, record)
            if timed_out:
                log.info("max_train_time_s=%s reached after %d steps", cfg.max_train_time_s, version)
                break
        if bar is not None:
            bar.close()
        return record

    def _engine_counters(self) -> tuple[int, float]:
        s = self.engine.stats()
        return s["generated_tokens"], s["busy_s"]

    def _evaluate(self, version: int) -> dict:
        """Held-out accuracy of exactly ``version`` (a second engine, run in this thread)."""
        self.eval_engine.update_weights(WeightUpdate(version, state_dict=self.trainer.state_dict()))
        return evaluate(self.eval_engine, self.tokenizer, self.valid, self.reward.eval_fn, self.eval_params)

    def _save(self, version: int) -> None:
        path = self.dir / "checkpoints" / f"step{version}"
        self.trainer.save(str(path), self.tokenizer)
        (self.dir / "checkpoints" / "latest").write_text(path.name + "\n")

    def close(self) -> None:
        self.rollout.stop()
        self.engine.stop()
        self.reward.close()
        self.timeline.close()
        self.logger.close()


def _batch_stats(batch, version: int) -> dict:
    mask = batch.loss_mask.bool()
    staleness = (version - batch.versions[mask]).float()
    spans = [len(set(row[m].tolist())) for row, m in zip(batch.versions, mask)]
    return {
        "reward_mean": float(batch.rewards.mean()),
        "reward_std": float(batch.rewards.std()) if len(batch.rewards) > 1 else 0.0,
        "staleness_max": int(staleness.max()) if staleness.numel() else 0,
        "staleness_mean": float(staleness.mean()) if staleness.numel() else 0.0,
        "staleness_hist": torch.bincount(staleness.long()).tolist() if staleness.numel() else [],
        "versions_per_sample_max": max(spans),
        "response_len_mean": float(mask.sum(-1).float().mean()),
        "response_len_max": int(mask.sum(-1).max()),
        "truncated_frac": float(batch.truncated.float().mean()),
        "n_samples": int(batch.input_ids.shape[0]),
    }


def _progress(cfg: TrainConfig):
    if not cfg.progress_bar:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.total_train_steps, desc="train", unit="step", dynamic_ncols=True)


def _report(bar, record: dict) -> None:
    line = summary_line(record)
    if bar is None:
        log.info(line)
        return
    bar.update(1)
    bar.set_postfix(reward=f"{record['reward_mean']:.3f}", stale=record["staleness_max"])
    bar.write(line)
