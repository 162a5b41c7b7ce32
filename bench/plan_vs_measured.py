"""The planner against measurements, side by side. Run by hand, alone:

    python bench/plan_vs_measured.py                    # part 1 (this machine, ~25 min) and part 2 (clusters)
    python bench/plan_vs_measured.py --part cluster     # part 2 only (seconds)
    python bench/plan_vs_measured.py --part machine --only agent   # part 1, the agent rows only

Part 1, this machine: one hardware profile is measured (``asyncrl plan --profile``, the default task's model),
then for each configuration (η 0..8, the single-turn default task and the agentic slow-tool environment of
bench/agent_env.py, two batch shapes; fixed 1 + 1 threads, and two rows with the cores shared, the CPU default,
predicted from a second profile measured for it) the planner predicts the run and ``asyncrl train`` measures it.
Printed: step time, generator busy fraction and trainer wait, predicted vs measured, the error, and the median absolute
error of the step time (goal: <= 15%, none worse than 30%; busy fraction within 0.10). The agent
configurations give the planner the calls per episode the η = 0 run measured (``--calls-per-episode``: an
input the planner cannot know from the configuration, said in the table).

Part 2, clusters: AReaL's Table 1 (arXiv 2505.24298: hours for 250 steps, 1.5B: 41.0 sync vs 14.8 async on
16 nodes of 8 H800; 7B: 57.7 vs 25.4 on 24 nodes) predicted from the workload's description alone and the
H800 specification profile (``asyncrl.plan.costs.spec_costs``), with one efficiency factor (on the decode
bandwidth share, the training and prefill MFU, all scaled together) fitted on the 1.5B row and the 7B row
predicted without refitting. Every assumption is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUIET = [
    "progress_bar=false",
    "report=false",
    "max_train_time_s=0",
    "saver.freq_steps=0",
    "evaluator.freq_steps=0",
    "valid_dataset.size=20",
    "watchdog.no_signal_steps=0",
    "cluster.cpu_split=fixed",
]  # 1 + 1 threads; the rows marked shared override it (cluster.cpu_split=auto)
SHARED = "cluster.cpu_split=auto"
AGENT = [
    "workflow.name=agent",
    "agent.episode=agent_env:episode",
    "agent.client=inprocess",
    "agent.options={attempts: 3, tool_latency_s: 0.5, tool_latency_p99_s: 2.0}",
    "rollout.max_slots=128",
]
CONFIGS = [  # (name, overrides, steps)
    ("default eta=0", ["rollout.max_head_offpolicyness=0"], 12),
    ("default eta=1", ["rollout.max_head_offpolicyness=1"], 12),
    ("default eta=2", ["rollout.max_head_offpolicyness=2"], 12),
    ("default eta=4", ["rollout.max_head_offpolicyness=4"], 12),
    ("default eta=8", ["rollout.max_head_offpolicyness=8"], 12),
    ("shared eta=0", ["rollout.max_head_offpolicyness=0", SHARED], 12),
    ("shared eta=2", ["rollout.max_head_offpolicyness=2", SHARED], 12),
    ("B8 n4 eta=0", ["rollout.max_head_offpolicyness=0", "train_dataset.batch_size=8", "gconfig.n_samples=4"], 16),
    ("B8 n4 eta=2", ["rollout.max_head_offpolicyness=2", "train_dataset.batch_size=8", "gconfig.n_samples=4"], 16),
    (
        "agent eta=0",
        ["rollout.max_head_offpolicyness=0", "train_dataset.batch_size=8", "gconfig.n_samples=4", *AGENT],
        8,
    ),
    (
        "agent eta=4",
        ["rollout.max_head_offpolicyness=4", "train_dataset.batch_size=8", "gconfig.n_samples=4", *AGENT],
        8,
    ),
]


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "bench"), str(REPO)])}


def asyncrl(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "asyncrl.cli", *args], env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"asyncrl {' '.join(args[:3])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def measured(run: Path) -> dict:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r["step"] > 1]  # the first step waits for the first batch
    wall = sum(r["step_time_s"] for r in steps)
    last = records[-1]
    return {
        "step_time_s": statistics.median(r["step_time_s"] for r in steps),
        "gen_busy_frac": sum(r["gen_busy_frac"] * r["step_time_s"] for r in steps) / wall,
        "trainer_wait_frac": sum(r["trainer_wait_s"] for r in steps) / wall,
        "calls_per_episode": last.get("agent_calls", 0) / max(1, last.get("agent_episodes", 0) or 1),
    }


def part_machine(out: Path, only: str = "") -> None:
    from machine import cpu

    print(cpu())
    configs = [c for c in CONFIGS if only in c[0]]
    profiles = {False: out / "profile.yaml", True: out / "profile-shared.yaml"}  # fixed threads; the shared split
    for shared, profile in profiles.items():
        if any((SHARED in c[1]) == shared for c in configs):
            asyncrl("plan", "--profile", str(profile), *QUIET, *([SHARED] if shared else []))
            print(f"profile: {profile}")
    rows, calls = [], None
    for name, overrides, steps in configs:
        profile = profiles[SHARED in overrides]
        run_dir = out / "runs" / name.replace(" ", "_").replace("=", "")
        asyncrl("train", *QUIET, *overrides, f"total_train_steps={steps}", f"output_dir={run_dir}", "resume=fresh")
        m = measured(run_dir / "asyncrl" / "default")
        agent = "workflow.name=agent" in overrides
        if agent and calls is None:
            calls = m["calls_per_episode"]  # the η = 0 run's, given to the planner for both agent rows
        # agent_env's episodes check every answer with the slow tool, the last one too, and ask again afresh
        extra = ["--calls-per-episode", f"{calls:.3f}", "--tool-after-last-call", "--fresh-calls"] if agent else []
        p = json.loads(
            asyncrl(
                "plan", "--hardware", str(profile), "--json", *extra, *QUIET, *overrides, f"total_train_steps={steps}"
            ).stdout
        )
        rows.append((name, p, m, agent))
        print(f"{name:<14} predicted {p['step_time_s']:.2f} s, measured {m['step_time_s']:.2f} s", flush=True)
    print(f"\n{'configuration':<14} {'step s':>15} {'err':>6} {'gen busy':>13} {'trainer wait':>13}")
    errors, busy = [], []
    for name, p, m, agent in rows:
        err = (p["step_time_s"] - m["step_time_s"]) / m["step_time_s"]
        errors.append(abs(err))
        busy.append(abs(p["gen_busy_frac"] - m["gen_busy_frac"]))
        note = f"  (calls/episode given: {calls:.2f})" if agent else ""
        print(
            f"{name:<14} {p['step_time_s']:>6.2f} / {m['step_time_s']:<6.2f} {err:>+6.0%} "
            f"{p['gen_busy_frac']:>5.2f} / {m['gen_busy_frac']:<5.2f} {p['trainer_wait_frac']:>5.2f} / "
            f"{m['trainer_wait_frac']:<5.2f}{note}"
        )
    print(
        f"\nstep time: median |error| {statistics.median(errors):.0%}, worst {max(errors):.0%}; generator busy "
        f"fraction: median |error| {statistics.median(busy):.2f}, worst {max(busy):.2f}  (predicted / measured)"
    )


# ---- part 2: clusters ------------------------------------------------------------------------------------------
TABLE_1 = {"1.5b": {"nodes": 16, "sync_h": 41.0, "async_h": 14.8}, "7b": {"nodes": 24, "sync_h": 57.7, "async_h": 25.4}}
ASSUMED = {
    "prompt tokens": 200,  # a DeepScaleR problem with the chat template
    "response median tokens": 8000,
    "response p99 tokens": 27648,  # long CoT with a tail at the cap (log-normal)
    "max new tokens": 27648,
    "prompts per step": 512,
    "samples per prompt": 16,
    "eta": 8,
    "minibatches": 4,
    "inference share": 0.75,
    "engine GPUs (tensor parallel)": 1,
    "KV memory share": 0.85,
    "simulated steps": 24,
    "simulated scale": 1 / 8,  # prompts, engines and training GPUs all scaled: same step time
}


def cluster_prediction(model: str, nodes: int, eta: int, efficiency: float) -> float:
    """Hours for 250 steps on ``nodes`` x 8 H800 (simulated, then scaled)."""
    from asyncrl.plan.costs import GPUS, MODELS, Efficiency, spec_costs
    from asyncrl.plan.lengths import long_tail
    from asyncrl.plan.simulate import Workload, simulate

    gpu, shape = GPUS["h800"], MODELS[f"r1-distill-qwen-{model}"]
    gpus = nodes * 8 * ASSUMED["simulated scale"]
    engines = int(gpus * ASSUMED["inference share"])
    trainers = int(gpus - engines)
    lengths = long_tail(ASSUMED["response median tokens"], ASSUMED["response p99 tokens"], ASSUMED["max new tokens"])
    mean_context = ASSUMED["prompt tokens"] + lengths.mean()
    kv_room = gpu.memory_bytes * ASSUMED["KV memory share"] - 2 * shape.params
    slots = max(8, int(kv_room / (shape.kv_bytes_per_token * mean_context)))
    base = Efficiency()  # every share of the peak scaled by the one fitted factor
    eff = dataclasses.replace(
        base,
        train_mfu=base.train_mfu * efficiency,
        prefill_mfu=base.prefill_mfu * efficiency,
        decode_bandwidth=base.decode_bandwidth * efficiency,
    )
    profile = spec_costs(gpu, shape, engine_gpus=1, train_gpus=trainers, eff=eff)
    w = Workload(
        batch_size=int(ASSUMED["prompts per step"] * ASSUMED["simulated scale"]),
        n_samples=ASSUMED["samples per prompt"],
        max_staleness=eta,
        prompt_tokens=ASSUMED["prompt tokens"],
        lengths=lengths,
        max_slots=slots,
        engines=engines,
        interrupt="recompute",
        steps=ASSUMED["simulated steps"],
        recompute=True,
    )
    p = simulate(w, profile.costs, chunk=512)
    return p.steady_step_time_s * 250 / 3600


def part_cluster() -> None:
    from asyncrl.plan.costs import Efficiency

    print("\nAReaL Table 1 from the workload description and the H800 specification profile")
    for k, v in ASSUMED.items():
        print(f"  assumed {k}: {v}")
    grid = [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2]
    best, fits = None, []
    for f in grid:  # fit the one factor on the 1.5B row (both arms)
        sync, async_ = cluster_prediction("1.5b", 16, 0, f), cluster_prediction("1.5b", 16, 8, f)
        row = TABLE_1["1.5b"]
        err = abs(sync - row["sync_h"]) / row["sync_h"] + abs(async_ - row["async_h"]) / row["async_h"]
        fits.append((f, sync, async_, err))
        if best is None or err < best[3]:
            best = (f, sync, async_, err)
    print(
        "  fit of one factor on all shares of the peak (training MFU, prefill MFU, decode bandwidth) on the 1.5B "
        "row: " + ", ".join(f"{f:.1f}: {s:.1f}/{a:.1f} h" for f, s, a, _ in fits)
    )
    f = best[0]
    e = Efficiency()
    print(
        f"  fitted factor {f:.2f}: training at {e.train_mfu * f:.0%} MFU, prefill at {e.prefill_mfu * f:.0%}, decode "
        f"at {e.decode_bandwidth * f:.0%} of HBM bandwidth (+{e.decode_step_overhead_s * 1e3:.0f} ms a step)"
    )
    print(
        f"\n{'model':<6} {'nodes':>5} {'sync h (pred / paper)':>22} {'async h (pred / paper)':>23} "
        f"{'ratio (pred / paper)':>21}"
    )
    for model, row in TABLE_1.items():
        sync = best[1] if model == "1.5b" else cluster_prediction(model, row["nodes"], 0, f)
        async_ = best[2] if model == "1.5b" else cluster_prediction(model, row["nodes"], 8, f)
        print(
            f"{model:<6} {row['nodes']:>5} {sync:>9.1f} / {row['sync_h']:<6.1f} "
            f"({(sync - row['sync_h']) / row['sync_h']:+.0%})"
            f" {async_:>9.1f} / {row['async_h']:<6.1f} ({(async_ - row['async_h']) / row['async_h']:+.0%})"
            f" {sync / async_:>8.2f} / {row['sync_h'] / row['async_h']:.2f}"
            + ("   (fitted)" if model == "1.5b" else "   (predicted)")
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["all", "machine", "cluster"], default="all")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "bench-plan")
    p.add_argument("--only", default="", help="part 1: only the configurations whose name holds this (e.g. agent)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.part in ("all", "machine"):
        part_machine(args.out, args.only)
    if args.part in ("all", "cluster"):
        part_cluster()
    return 0


if __name__ == "__main__":
    sys.exit(main())
