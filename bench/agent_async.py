"""Agentic RL where tools are slow: synchronous (η = 0) against asynchronous (η > 0), side by side.

    python bench/agent_async.py                       # η = 0, 1, 2, 4; 3 attempts; tool latency median 1 s, p99 8 s
    python bench/agent_async.py --steps 10 --etas 0,4 --latency 0.5 --p99 4
    python bench/agent_async.py --etas 0,1,2,4,8,auto  # η tuned online (≤ --limit) against every fixed η
    python bench/agent_async.py --task lookup --steps 30 --etas 0,2,4 --batch 8 --n 8 --latency 0.5 --p99 4 \
        --eval-every 10 --target 0.15     # the lookup task from builtin:tiny-agent (examples/agent_lookup.yaml)

Each arm is one ``asyncrl train`` process with ``workflow.name=agent`` and the episode of
``bench/agent_env.py`` (answer, wait for a slow checker tool with log-normal latency, retry if wrong), on the shipped
model, same seed, prompts and batch shape (``--batch`` groups of ``--n`` episodes per step); only η and the
thread split differ (sync: both cores for each phase; async: one core each for the trainer and the engine,
at the same time). It prints, per arm: wall time for ``--steps`` steps, time per step, the speedup over η = 0,
the generator's busy fraction, the trainer's wait, tool time per episode and staleness.

With ``--task lookup`` each arm is ``asyncrl train --config examples/agent_lookup.yaml`` instead: the built-in
lookup task from ``builtin:tiny-agent``, every ``lookup`` call delayed by the latency.

Held-out accuracy: the fraction of problems an episode solves (greedy, no tool latency in evaluation).
In a synchronous step every episode of the batch must finish, so the step waits for the slowest chain of tool
calls; asynchronously, admission keeps up to (η + v + 1)·B groups in flight, and episodes waiting on tools
leave the engine to the others.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu  # bench/ is on the path of a script run from it

REPO = Path(__file__).resolve().parent.parent


def run_arm(eta: int | str, args: argparse.Namespace, out: Path) -> dict:
    sync = eta == 0
    threads = [
        "cluster.cpu_split=fixed",
        *(["actor.threads=2", "rollout.threads=2"] if sync else ["actor.threads=1", "rollout.threads=1"]),
    ]
    if args.task == "lookup":
        task = [
            "--config",
            str(REPO / "examples" / "agent_lookup.yaml"),
            f"agent.options={{max_turns: 6, python: true, tool_latency_s: {args.latency}, "  # the YAML's,
            f"tool_latency_p99_s: {args.p99}}}",
        ]  # as the override replaces the whole dict
    else:
        task = [
            "workflow.name=agent",
            "agent.episode=agent_env:episode",
            "agent.client=inprocess",
            f"agent.options={{attempts: {args.attempts}, tool_latency_s: {args.latency}, "
            f"tool_latency_p99_s: {args.p99}}}",
        ]
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        *task,
        f"output_dir={out}",
        f"experiment_name=eta{eta}",
        "progress_bar=false",
        "report=false",
        "max_train_time_s=0",
        f"rollout.max_head_offpolicyness={eta}",
        f"rollout.max_staleness_limit={args.limit}",
        f"total_train_steps={args.steps}",
        f"train_dataset.batch_size={args.batch}",
        f"gconfig.n_samples={args.n}",
        f"gconfig.max_new_tokens={args.max_new_tokens}",
        f"evaluator.freq_steps={args.eval_every}",
        f"valid_dataset.size={args.eval_size}",
        "rollout.max_slots=128",
        f"seed={args.seed}",
        "saver.freq_steps=0",
        *threads,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "bench"), str(REPO)])}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"arm η={eta} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / f"eta{eta}" / "default" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    evals = [
        (r["step"], r["elapsed_s"] if r["step"] else 0.0, r["eval_accuracy"]) for r in records if "eval_accuracy" in r
    ]
    target = evals[0][2] + args.target
    reached = next((t for _, t, a in evals if a >= target), None)
    train_s = steps[-1]["elapsed_s"]  # from the first admission to the last step (no start-up, no step-0 eval)
    episodes = steps[-1].get("agent_episodes", 0)  # counters are cumulative
    return {
        "eta": eta,
        "steps": len(steps),
        "train_s": train_s,
        "wall_s": wall,
        "step_s": train_s / len(steps),
        "gen_busy": sum(r["gen_busy_frac"] for r in steps) / len(steps),
        "trainer_wait_s": sum(r["trainer_wait_s"] for r in steps) / len(steps),
        "staleness_max": max(r["staleness_max"] for r in steps),
        "etas": [r.get("max_staleness") for r in steps],  # η per step (tuned, for auto)
        "tool_s_per_episode": steps[-1].get("agent_tool_s", 0.0) / max(1, episodes),
        "reward_mean": sum(r["reward_mean"] for r in steps) / len(steps),
        "episode_failures": steps[-1].get("agent_episode_failures", 0),
        "evals": evals,
        "time_to_target_s": reached,
        "final_accuracy": evals[-1][2],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--task",
        choices=("checker", "lookup"),
        default="checker",
        help="checker: bench/agent_env.py on the arithmetic model; lookup: examples/agent_lookup.yaml",
    )
    p.add_argument("--etas", default="0,1,2,4", help="comma-separated η values; 'auto' tunes η online")
    p.add_argument("--limit", type=int, default=8, help="rollout.max_staleness_limit, the bound of η=auto")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=4, help="prompt groups per step (B)")
    p.add_argument("--n", type=int, default=4, help="episodes per group")
    p.add_argument("--attempts", type=int, default=3, help="LLM calls per episode at most (each checked by the tool)")
    p.add_argument("--latency", type=float, default=1.0, help="tool latency median, seconds")
    p.add_argument("--p99", type=float, default=8.0, help="tool latency 99th percentile, seconds")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per LLM call (default 48; lookup: 64)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=5, help="held-out evaluation (greedy episodes, no tool latency)")
    p.add_argument("--eval-size", type=int, default=100)
    p.add_argument("--target", type=float, default=0.08, help="time to this much above the step-0 accuracy")
    p.add_argument("--out", default=str(REPO / "outputs" / "bench" / "agent_async"))
    args = p.parse_args(argv)
    if args.max_new_tokens is None:
        args.max_new_tokens = 64 if args.task == "lookup" else 48
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    shape = f"up to {args.attempts} checked attempts" if args.task == "checker" else "lookups of 1-3 boxes"
    print(
        f"# agent_async ({args.task}): {args.steps} steps of {args.batch}x{args.n} episodes, {shape}, tool latency "
        f"median {args.latency}s p99 {args.p99}s; {cpu()}"
    )
    results = [run_arm(e if e == "auto" else int(e), args, out) for e in args.etas.split(",")]
    base = next((r for r in results if r["eta"] == 0), None)
    print(
        "| η | steps | train s | s/step | speedup | time to target s | its speedup | final acc | gen busy | "
        "trainer wait s/step | tool s/episode | stale max |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        speed = f"{base['train_s'] / r['train_s']:.2f}x" if base else "-"
        ttt = r["time_to_target_s"]
        tspeed = f"{base['time_to_target_s'] / ttt:.2f}x" if base and base["time_to_target_s"] and ttt else "-"
        print(
            f"| {r['eta']} | {r['steps']} | {r['train_s']:.1f} | {r['step_s']:.2f} | {speed} | "
            f"{'-' if ttt is None else f'{ttt:.0f}'} | {tspeed} | {r['final_accuracy']:.3f} | {r['gen_busy']:.2f} | "
            f"{r['trainer_wait_s']:.2f} | {r['tool_s_per_episode']:.2f} | {r['staleness_max']} |"
        )
    for r in results:
        if r["eta"] == "auto":
            print(f"η=auto per step: {r['etas']}")
        print(
            f"η={r['eta']} evaluations (step, s, accuracy): "
            + ", ".join(f"({s}, {t:.0f}, {a:.2f})" for s, t, a in r["evals"])
        )
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
