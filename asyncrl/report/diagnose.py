"""``asyncrl diagnose RUN_DIR [--json]``: where a run's time went and what to change (``asyncrl.telemetry.verdict``).
Works on a run still running (it reads what has been written), on a run directory copied from another machine
(only its files are read), and on an ``asyncrl sft`` output directory (``sft_metrics.jsonl``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asyncrl.cluster.placement import resolve_transport
from asyncrl.telemetry.record import ReportError, load_run, read_jsonl
from asyncrl.telemetry.verdict import Verdict, diagnose, diagnose_sft

PROG = "asyncrl diagnose"
SFT_METRICS = "sft_metrics.jsonl"
MACHINE_FILE = "machine.json"  # where a run ran: written by asyncrl.launch.rundir.write_machine, read here


def run_settings(run) -> dict:
    """What the rules need to know of a run's configuration (``config.yaml``); ``cpu_split`` only where the
    auto split applied (the built-in engine in the process, one trainer rank, the CPU), as the run's
    ``machine.json`` says. Runs from before that file: read from config.yaml, where ``cluster.device=auto`` counts as
    the CPU on a machine without a GPU."""
    settings = {
        name: _number(run, key)
        for name, key in (
            ("max_staleness", "rollout.max_head_offpolicyness"),
            ("n_samples", "gconfig.n_samples"),
            ("max_new_tokens", "gconfig.max_new_tokens"),
            ("workers", "reward.workers"),
            ("lr", "actor.lr"),
        )
        if run.setting(key) is not None
    }
    settings["policy_loss"] = str(run.setting("actor.policy_loss") or "decoupled_ppo")
    settings["one_step"] = one_step(
        _number(run, "actor.ppo_n_minibatches"), _number(run, "actor.ppo_epochs"), run.setting("actor.prox_logp_method")
    )
    settings["trusted"] = trusted(run.setting("actor", {}))
    settings["eval_background"] = run.setting("evaluator.background") is True
    settings["save_background"] = bool(run.setting("saver.background"))
    transport, backend = run.setting("rollout.weight_transport"), str(run.setting("rollout.backend") or "local")
    if transport:
        settings["transport"] = resolve_transport(str(transport), backend.split(":")[0])
    machine = _machine(run.path)
    if machine is not None:
        settings["device"] = str(machine.get("device") or "cpu").split(":")[0]
        if machine.get("cpu_split"):
            settings["cpu_split"] = machine["cpu_split"]
        if isinstance(machine.get("eval_background"), bool):  # where evaluation ran (evaluator.background=auto chose)
            settings["eval_background"] = machine["eval_background"]
        if machine.get("eval_background_why"):
            settings["eval_background_why"] = str(machine["eval_background_why"])
    elif _split_applied(run):
        settings["cpu_split"] = run.setting("cluster.cpu_split") or "fixed"  # runs from before the key: fixed
    return settings


def trusted(actor: dict) -> bool:
    """Whether a saved actor section has a trust region across versions: a behaviour trust term on a decoupled
    loss (``behav_eps_clip: auto`` there since it became the default; runs from before it had none)."""
    from asyncrl.algo.losses import DECOUPLED, dual_anchor

    loss = str(actor.get("policy_loss", "decoupled_ppo")) if isinstance(actor, dict) else ""
    if loss not in DECOUPLED:
        return False
    anchor = dual_anchor(loss, actor.get("eps_clip", 0.2), actor.get("behav_eps_clip"))
    return any(v is not None for v in (anchor, actor.get("behav_prob_delta"), actor.get("behav_m2_budget")))


def _number(run, key: str):
    """A numeric setting of the run's config.yaml (None where absent); another type is a ReportError naming it."""
    value = run.setting(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ReportError(f"{run.path / 'config.yaml'}: {key} must be a number, got {value!r:.40}")
    return value


def one_step(minibatches, epochs, prox_logp_method) -> bool:
    """Whether the proximal policy is the policy being trained (one optimizer step per batch, not AReaL's
    loglinear proximal policy): the decoupled clip cannot bind there."""
    return (minibatches or 1) * (epochs or 1) == 1 and prox_logp_method != "loglinear"


def _machine(path: Path) -> dict | None:
    """The run's ``machine.json`` (where it ran), or None (older runs, or unreadable)."""
    try:
        machine = json.loads((Path(path) / MACHINE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return machine if isinstance(machine, dict) else None


def _split_applied(run) -> bool:
    from asyncrl.cluster.placement import ACTOR_KINDS, ROLLOUT_KINDS, PlacementError, parse

    device = run.setting("cluster.device")
    try:
        one_rank = parse(str(run.setting("actor.backend") or "ddp:d1"), "actor.backend", ACTOR_KINDS).dp == 1
        local = parse(str(run.setting("rollout.backend") or "local"), "rollout.backend", ROLLOUT_KINDS).kind == "local"
    except PlacementError:
        return False
    return (device == "cpu" or (device in ("auto", None) and not _has_gpu())) and one_rank and local


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def diagnose_dir(path: str | Path) -> Verdict:
    """The verdict on a run directory (``metrics.jsonl``) or an SFT output (``sft_metrics.jsonl``)."""
    path = Path(path)
    if (path / SFT_METRICS).is_file() and not (path / "metrics.jsonl").is_file():
        return diagnose_sft(read_jsonl(path / SFT_METRICS))
    run = load_run(path)
    return diagnose(run.records, run_settings(run))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory of asyncrl train (metrics.jsonl) or an asyncrl sft output")
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        verdict = diagnose_dir(args.run_dir)
    except (ReportError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(verdict.to_dict()) if args.json else "\n".join(verdict.lines()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
