"""``asyncrl plan [--config FILE] [key=value ...]``: predict what ``asyncrl train`` with the same configuration
would do, without training (``asyncrl.plan``): step time, tokens/s, the generator's busy share, the trainer's
wait, staleness, the time for the configured steps; ``--sweep KEY=V1,V2,...`` compares settings and recommends
one. The costs come from a hardware profile: measured here (``--profile``, written to a YAML file to keep and
edit), fitted from a run directory (``--from-run DIR``), or read from a file (``--hardware FILE``).
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import itertools
import json
import logging
import sys
from pathlib import Path

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.formats import stop_ids
from asyncrl.plan.calibrate import Fitted, fit_run, measure
from asyncrl.plan.costs import load_profile, save_profile
from asyncrl.plan.lengths import Lengths
from asyncrl.plan.simulate import ToolLatency, Workload, simulate

log = logging.getLogger(__name__)
PROG = "asyncrl plan"
SIMULATED_STEPS = 60  # steps simulated; the time for more is extrapolated from their mean
KEYS = ("step_time_s", "gen_busy_frac", "trainer_wait_frac", "staleness_mean", "tokens_per_s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file of overrides (as asyncrl train)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, as asyncrl train")
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="predict each value of KEY (repeat for a grid), e.g. rollout.max_head_offpolicyness=0,1,2,4,8",
    )
    p.add_argument(
        "--profile",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="measure the costs on this machine for the configured model (a couple of minutes) and write "
        "them to FILE (default outputs/plan/profile.yaml)",
    )
    p.add_argument("--hardware", metavar="FILE", help="a hardware profile written by --profile (or edited by hand)")
    p.add_argument(
        "--from-run",
        metavar="DIR",
        help="fit the costs and lengths from a run directory's metrics; with "
        "--hardware or --profile, only its workload (response lengths, "
        "prompt size, calls and tool time per episode)",
    )
    p.add_argument(
        "--calls-per-episode",
        type=float,
        default=None,
        metavar="N",
        help="agent workflows: LLM calls per episode (default: what --from-run measured, else 1); tool "
        "latency comes from agent.options tool_latency_s / tool_latency_p99_s",
    )
    p.add_argument(
        "--tool-after-last-call",
        action="store_true",
        help="agent workflows: episodes wait on a tool after their last LLM call too (e.g. a checker of "
        "the final answer); else tools come only between calls",
    )
    p.add_argument(
        "--fresh-calls",
        action="store_true",
        help="agent workflows: each LLM call of an episode is a new conversation with the same prompt "
        "(retries, votes over samples); else each call continues the one before",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (a list for a sweep)")
    p.add_argument("--html", metavar="FILE", help="write a page with the sweep's curves")


DEFAULT_PROFILE = Path("outputs/plan/profile.yaml")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = configlib.load(TrainConfig, args.config, args.overrides)
        sweep = _sweep_values(args.sweep)
        fitted = _fitted(cfg, args)
        if args.calls_per_episode is not None:
            fitted = dataclasses.replace(fitted, calls_per_episode=args.calls_per_episode)
        if args.tool_after_last_call:
            fitted = dataclasses.replace(fitted, tool_after_last=True)
        if args.fresh_calls:
            fitted = dataclasses.replace(fitted, fresh_calls=True)
        results, inputs = [], []
        for point in sweep:
            point_cfg = configlib.load(TrainConfig, args.config, args.overrides + [f"{k}={v}" for k, v in point])
            inputs.append(workload(point_cfg, fitted))
            results.append((dict(point), simulate(inputs[-1], fitted.profile.costs), point_cfg.total_train_steps))
    except (ConfigError, ValueError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    rows = [
        {
            **point,
            **{k: getattr(p, k) for k in KEYS},
            "trained_tokens_per_s": p.trained_tokens_per_s,
            "time_for_steps_s": p.mean_step_time_s * steps,
            "steps": steps,
            "staleness_hist": {str(k): v for k, v in sorted(p.staleness_hist.items())},
            "max_staleness": p.max_staleness[-1] if p.max_staleness else None,
        }
        for point, p, steps in results
    ]
    best = recommend(rows) if len(rows) > 1 else None
    if len(inputs) > 1 and all(w == inputs[0] for w in inputs):
        print(
            "note: the swept settings do not change what the plan simulates (the workload and the costs are the "
            "same in every row): costs come from one profile or run, so thread counts, ranks and servers need a "
            "profile measured for each (`asyncrl plan --profile FILE` under those settings)",
            file=sys.stderr,
        )
    for row in rows if best is not None else []:
        row["recommended"] = row is best
    costs = fitted.profile.costs
    if cfg.cpu_sharing() != "fixed" and costs.train_borrow_x == 1.0:
        print(
            "note: this run shares the CPU's cores (cluster.cpu_split=auto), but the profile has no speedup for "
            "the trainer's borrowed core (measured with fixed threads, or fitted from a run): the plan takes it "
            "as 1, so a trainer-bound run will be faster than predicted; `asyncrl plan --profile` measures it",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows))
    else:
        print(render_table(rows, fitted, best))
    if args.html:
        Path(args.html).write_text(render_page(rows, fitted, best))
        print(f"page: {args.html}", file=sys.stderr)
    return 0


def _sweep_values(specs: list[str]) -> list[list[tuple[str, str]]]:
    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not values:
            raise ConfigError(f"--sweep '{spec}' must look like key.sub=v1,v2,...")
        axes.append([(key.strip(), v.strip()) for v in values.split(",") if v.strip()])
    return [list(point) for point in itertools.product(*axes)] if axes else [[]]


def _fitted(cfg: TrainConfig, args) -> Fitted:
    """The costs and the workload: from a run (``--from-run``), a profile (``--profile``, ``--hardware``), or the
    profile's costs with the run's workload when both are named (a run's lengths after RL has lengthened them)."""
    run = _from_run(cfg, args.from_run) if args.from_run else None
    if run is not None and args.profile is None and not args.hardware:
        return run
    hardware = _from_profile(cfg, args)
    return hardware if run is None else dataclasses.replace(run, profile=hardware.profile)


def _from_run(cfg: TrainConfig, run_dir: str) -> Fitted:
    """The costs of the run in ``run_dir``, divided by its own passes and samples per prompt (its config.yaml:
    the settings asked about may differ from those it ran with)."""
    from asyncrl.telemetry.metrics import read_metrics
    from asyncrl.telemetry.record import ReportError

    config = Path(run_dir) / "config.yaml"
    if not (Path(run_dir) / "metrics.jsonl").is_file():
        raise ValueError(
            f"--from-run {run_dir} is not a run directory: it has no metrics.jsonl (asyncrl train writes "
            "outputs/<experiment_name>/<trial_name>/metrics.jsonl; an asyncrl sft output cannot be "
            "fitted)"
        )
    try:
        records = read_metrics(run_dir)
        saved = configlib.read_mapping(config) if config.is_file() else {}
    except (OSError, ReportError, ConfigError) as e:
        raise ValueError(f"--from-run {run_dir}: {getattr(e, 'strerror', None) or e}") from None
    actor = _section(saved, "actor", config) or dataclasses.asdict(cfg.actor)
    n_samples = _section(saved, "gconfig", config).get("n_samples", cfg.gconfig.n_samples)
    counts = {f"actor.{k}": actor.get(k, 1) for k in ("ppo_epochs", "ppo_n_minibatches")}
    for key, value in {**counts, "gconfig.n_samples": n_samples}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--from-run {run_dir}: {config}: {key} must be a positive integer, got {value!r}")
    return fit_run(
        records,
        cfg.gconfig.max_new_tokens,
        n_samples,
        name=str(run_dir),
        epochs=actor.get("ppo_epochs", 1),
        passes=no_grad_passes(actor),
    )


def _section(saved: dict, name: str, path: Path) -> dict:
    """One section of a saved config.yaml, which must be a mapping where present."""
    section = saved.get(name) or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: '{name}' must be a section of keys, got {type(section).__name__}")
    return section


def _from_profile(cfg: TrainConfig, args) -> Fitted:
    if args.profile is not None:
        fitted = measure_profile(cfg)
        path = save_fitted(fitted, Path(args.profile) if args.profile else DEFAULT_PROFILE)
        print(f"profile: {path}", file=sys.stderr)
        return fitted
    path = Path(args.hardware) if args.hardware else DEFAULT_PROFILE
    if not path.exists():
        raise ValueError(
            f"no hardware profile at {path}: measure one with `asyncrl plan --profile` (a couple of "
            "minutes), fit one with --from-run RUN_DIR, or name one with --hardware FILE"
        )
    return load_fitted(path, cfg)


def save_fitted(fitted: Fitted, path: Path) -> Path:
    save_profile(fitted.profile, path)
    import yaml

    data = yaml.safe_load(path.read_text())
    data["workload"] = {
        "prompt_tokens": fitted.prompt_tokens,
        "lengths": dataclasses.asdict(fitted.lengths),
        "positions_x": fitted.positions_x,
    }
    data["workload"]["lengths"]["values"] = list(fitted.lengths.values)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_fitted(path: Path, cfg: TrainConfig) -> Fitted:
    import yaml

    profile = load_profile(path)
    extra = (yaml.safe_load(path.read_text()) or {}).get("workload") or {}
    lengths = extra.get("lengths") or {"kind": "fixed", "median": cfg.gconfig.max_new_tokens // 2}
    lengths = Lengths(**{**lengths, "values": tuple(lengths.get("values") or ()), "cap": cfg.gconfig.max_new_tokens})
    return Fitted(
        profile, lengths, int(extra.get("prompt_tokens", 24)), positions_x=float(extra.get("positions_x", 1.0))
    )


def no_grad_passes(actor: dict) -> int:
    """The forward passes without a gradient a training step makes over its batch (``actor``: the actor section
    as a dict, also a saved config.yaml's): the proximal recompute (more than one optimizer step a batch, not
    loglinear), the reference model, the critic's values."""
    steps = actor.get("ppo_n_minibatches", 1) * actor.get("ppo_epochs", 1)
    proximal = steps > 1 and actor.get("prox_logp_method", "recompute") == "recompute"
    return int(proximal) + int(actor.get("ref_model", "none") != "none") + int(actor.get("critic", "none") != "none")


def workload(cfg: TrainConfig, fitted: Fitted) -> Workload:
    """The simulation's input for ``cfg``, with the lengths and prompt size the profile measured."""
    backend = cfg.rollout.placement
    options = cfg.agent.options if cfg.workflow.name == "agent" else {}
    agent = cfg.workflow.name == "agent"
    return Workload(
        batch_size=cfg.train_dataset.batch_size,
        n_samples=cfg.gconfig.n_samples,
        max_staleness=cfg.rollout.max_head_offpolicyness,
        staleness_limit=cfg.rollout.max_staleness_limit,
        prompt_tokens=fitted.prompt_tokens,
        lengths=dataclasses.replace(fitted.lengths, cap=cfg.gconfig.max_new_tokens),
        max_slots=cfg.rollout.max_slots,
        engines=1 if backend.kind == "local" else max(1, backend.dp),
        max_concurrent=cfg.rollout.max_concurrent_rollouts,
        interrupt=cfg.rollout.interrupt_mode,
        steps=min(cfg.total_train_steps, SIMULATED_STEPS),
        eval_every=cfg.evaluator.freq_steps,
        save_every=cfg.saver.freq_steps,
        epochs=cfg.actor.ppo_epochs,
        recompute=no_grad_passes(dataclasses.asdict(cfg.actor)),
        calls_per_episode=max(1.0, fitted.calls_per_episode) if agent else 1,
        tool=ToolLatency(
            float(options.get("tool_latency_s", fitted.tool_s)),
            float(options.get("tool_latency_p99_s", options.get("tool_latency_s", fitted.tool_s))),
        )
        if agent
        else ToolLatency(),
        tool_after_last=agent and fitted.tool_after_last,
        fresh_calls=agent and fitted.fresh_calls,
        shared_prefix=cfg.actor.shared_prefix,
        positions_x=fitted.positions_x,
        reward_workers=max(1, cfg.reward.workers),
        cpu_split=cfg.cpu_sharing(),
        seed=cfg.seed,
    )


def measure_profile(cfg: TrainConfig) -> Fitted:
    """Measure the configured model's costs on this machine (``asyncrl.plan.calibrate.measure``)."""
    import torch

    from asyncrl.cluster.cores import CoreShare, process_cores
    from asyncrl.data.config import dataset_from_config
    from asyncrl.launch.shape import context_len
    from asyncrl.models.hf import check_model_dir, load_model, load_tokenizer
    from asyncrl.reward import reward_function
    from asyncrl.reward.base import call_reward
    from asyncrl.trainer import build_trainer
    from asyncrl.weights.publish import build_publisher

    path = check_model_dir(cfg.model.path)
    tokenizer, model = load_tokenizer(path), load_model(path)
    max_len = context_len(cfg.rollout, model.config.max_position_embeddings, cfg.gconfig.max_new_tokens)
    data = dataset_from_config(
        cfg.task,
        cfg.train_dataset,
        cfg.valid_dataset,
        tokenizer=tokenizer,
        default_max_prompt_tokens=max_len - cfg.gconfig.max_new_tokens,
    )
    items = list(itertools.islice(data.train, 32))
    prompts = [it["prompt_ids"] for it in items]
    fn = reward_function(cfg.reward, data.reward_fn)

    # per pass of the policy: the plan adds the passes, and the reference model's as one without a gradient
    one_pass = dataclasses.replace(cfg.actor, ppo_epochs=1, ppo_n_minibatches=1, ref_model="none", kl_ctl=0.0)

    def make_trainer(m):
        return build_trainer(
            one_pass,
            m,
            model_path=path,
            temperature=cfg.gconfig.temperature,
            autocast_dtype=None,
            max_new_tokens=cfg.gconfig.max_new_tokens,
            top_p=cfg.gconfig.top_p,
            top_k=cfg.gconfig.top_k,
        )

    def publish(state_dict, version):
        from asyncrl.engine.local import LocalEngine

        engine = LocalEngine(model, max_slots=2, max_len=max_len, threads=1).start()  # no pool of workers
        publisher = build_publisher(cfg.rollout.resolved_transport, [engine], timeout_s=60.0)
        try:
            return publisher.publish(state_dict, version)
        finally:
            publisher.close()
            engine.stop()

    def save(m, directory):
        m.save_pretrained(directory)
        torch.save(torch.optim.AdamW(m.parameters()).state_dict(), Path(directory) / "trainer.pt")

    engine_threads, trainer_threads, trainer_most = cfg.rollout.threads, cfg.actor.threads, 0
    if (
        cfg.cpu_sharing() != "fixed"
    ):  # each side's share while both work, and the trainer's most (asyncrl.cluster.cores)
        share = CoreShare(process_cores())
        engine_threads, trainer_threads, trainer_most = share.engine_threads(), share.trainer_threads(), share.most
    return measure(
        model,
        tokenizer,
        prompts,
        max_slots=cfg.rollout.max_slots,
        max_len=max_len,
        max_new_tokens=cfg.gconfig.max_new_tokens,
        n_samples=cfg.gconfig.n_samples,
        temperature=cfg.gconfig.temperature,
        stop_token_ids=stop_ids(tokenizer),
        engine_threads=engine_threads,
        trainer_threads=trainer_threads,
        trainer_most=trainer_most,
        make_trainer=make_trainer,
        publish=publish if cfg.rollout.placement.kind == "local" else None,
        reward=lambda text: call_reward(fn, items[0], text),
        save=save,
        eval_items=cfg.valid_dataset.size,
        name=cfg.model.path,
    )


def recommend(rows: list[dict]) -> dict:
    """The setting to choose: among those within 5% of the most trained tokens per second (settings such as
    gconfig.n_samples change the work of a step, so step times alone do not compare), the one with the least
    staleness (staleness costs accuracy: docs/planner.md)."""
    most = max(r["trained_tokens_per_s"] for r in rows)
    near = [r for r in rows if r["trained_tokens_per_s"] >= most / 1.05]
    return min(near, key=lambda r: (r["staleness_mean"], -r["trained_tokens_per_s"]))


def _point(row: dict) -> str:
    keys = [k for k in row if "." in k]
    return " ".join(f"{k}={row[k]}" for k in keys) or "as configured"


def render_table(rows: list[dict], fitted: Fitted, best: dict | None) -> str:
    lines = [
        f"costs: {fitted.profile.name} ({fitted.profile.source}); lengths {fitted.lengths.describe()}",
        f"{'setting':<36} {'step s':>7} {'tok/s':>8} {'gen busy':>8} {'waits':>6} {'stale':>6} {'time for steps':>15}",
    ]
    for r in rows:
        mark = " <- recommended" if best is r else ""
        lines.append(
            f"{_point(r):<36} {r['step_time_s']:>7.2f} {r['tokens_per_s']:>8.0f} {r['gen_busy_frac']:>8.0%} "
            f"{r['trainer_wait_frac']:>6.0%} {r['staleness_mean']:>6.2f} {r['time_for_steps_s'] / 60:>11.1f} min"
            f"{mark}"
        )
    return "\n".join(lines)


def render_page(rows: list[dict], fitted: Fitted, best: dict | None) -> str:
    """A self-contained page: the table, and one SVG chart per predicted quantity across the sweep."""
    charts = "".join(
        _svg_chart(rows, key)
        for key in ("step_time_s", "tokens_per_s", "gen_busy_frac", "trainer_wait_frac", "staleness_mean")
    )
    table = html.escape(render_table(rows, fitted, best))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in fitted.profile.notes)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>asyncrl plan</title></head><body "
        f"style='font-family:sans-serif;max-width:1000px;margin:auto'><h1>asyncrl plan</h1><pre>{table}</pre>"
        f"{charts}<h2>Profile</h2><ul>{notes}</ul></body></html>"
    )


def _svg_chart(rows: list[dict], key: str, width: int = 420, height: int = 220) -> str:
    values = [float(r[key]) for r in rows]
    top = max(values) * 1.1 or 1.0
    n = len(values)
    xs = [40 + i * (width - 60) / max(1, n - 1) for i in range(n)]
    ys = [height - 30 - v / top * (height - 50) for v in values]
    path = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(zip(xs, ys)))
    labels = "".join(
        f"<text x='{x:.1f}' y='{height - 10}' font-size='10' text-anchor='middle'>"
        f"{html.escape(_point(r).split('=')[-1])}</text>"
        for x, r in zip(xs, rows)
    )
    dots = "".join(
        f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3'/><text x='{x:.1f}' y='{y - 6:.1f}' font-size='10' "
        f"text-anchor='middle'>{v:.3g}</text>"
        for x, y, v in zip(xs, ys, values)
    )
    return (
        f"<figure style='display:inline-block'><svg width='{width}' height='{height}'><path d='{path}' "
        f"fill='none' stroke='#1f77b4' stroke-width='2'/>{dots}{labels}</svg><figcaption>{key}</figcaption>"
        "</figure>"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))
