"""The Ray launcher (``launcher=ray``): one placement group holds the run's inference servers and trainer ranks.

``asyncrl train launcher=ray actor.backend=ddp:d2 rollout.backend=asyncrl:d1 ...`` makes this process the driver:

1. it connects to Ray: the cluster at ``cluster.ray_address``, or a Ray it starts on this machine (its cores,
   no dashboard), which it also shuts down at the end;
2. it reserves one placement group (``bundle_plan``): one bundle per trainer rank (its ``actor.threads`` CPUs,
   or one GPU) and one per engine server of ``rollout.backend`` asyncrl/vllm/sglang (``rollout.threads`` CPUs,
   or ``t`` GPUs); on the Ray it starts itself, CPU requests are scaled down to fit the machine's cores;
3. one actor per bundle supervises one asyncrl process on its node: the servers (``asyncrl serve`` or
   vLLM/SGLang, bound to the node's address) report their URLs, then each rank runs ``asyncrl train`` with
   the run's config rewritten to ``rollout.backend=remote`` at those URLs and the torchrun environment
   (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` = rank 0's node, ``MASTER_PORT``) plus ``ASYNCRL_RAY_RANK``,
   which tells ``asyncrl.launch.train`` that it runs a rank, not this launcher;
4. it returns rank 0's last metrics record, and on every path (success, a failed rank or server, Ctrl-C)
   stops the processes (SIGINT, then SIGTERM, then SIGKILL), kills the actors and removes the group.

This is the only module that imports ``ray``, and only inside the functions that need it: ``bundle_plan`` works
without Ray installed, and so does ``asyncrl.launch.slurm`` (a Slurm job that starts a Ray cluster and runs the
driver).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from asyncrl.configlib import ConfigError
from asyncrl.launch.ranks import RANK_ENV, RESUME_ENV
from asyncrl.launch.supervise import RANK_0_STOP, RANK_STOP, Supervisor

log = logging.getLogger(__name__)

FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "TOKENIZERS_PARALLELISM")
"""The driver's values of these reach the trainer processes (a cluster's workers have the raylet's environment)."""
SERVER_KINDS = ("asyncrl", "vllm", "sglang")
POLL_S = 2.0  # how often the driver asks the ranks whether they have exited
STOP_TIMEOUT_S = sum(t for _, t in RANK_0_STOP) + 20


@dataclass(frozen=True)
class Bundle:
    """One bundle of the placement group and the process it holds."""

    role: str  # "trainer" (a trainer rank) | "server" (an inference server)
    index: int  # the rank, or the server's number
    resources: dict  # Ray resources: {"CPU": c} or {"CPU": c, "GPU": g}


def bundle_plan(cfg, device: str = "cpu", cpus: float | None = None) -> list[Bundle]:
    """The placement group of run ``cfg`` (a ``TrainConfig``): trainer ranks first, then servers. ``device``
    is ``cpu`` or ``cuda`` (one GPU per rank, ``t`` per server); ``cpus``, if given, is what the CPU requests
    must fit in all together (a Ray started on this machine): they are then scaled down alike, so processes
    share cores (fractional CPUs, at least 0.01 each)."""
    rollout = cfg.rollout.placement
    world = cfg.actor.world_size
    gpu = device == "cuda"
    plan = []
    for rank in range(world):
        threads = cfg.actor.threads + (cfg.rollout.threads if rank == 0 and rollout.kind == "local" else 0)
        plan.append(Bundle("trainer", rank, {"CPU": float(threads), **({"GPU": 1.0} if gpu else {})}))
    if rollout.kind in SERVER_KINDS:
        for s in range(rollout.dp):
            plan.append(
                Bundle("server", s, {"CPU": float(cfg.rollout.threads), **({"GPU": float(rollout.tp)} if gpu else {})})
            )
    total = sum(b.resources["CPU"] for b in plan)
    if cpus is not None and total > cpus:
        scale = cpus / total
        plan = [
            dataclasses.replace(
                b, resources={**b.resources, "CPU": max(0.01, math.floor(b.resources["CPU"] * scale * 100) / 100)}
            )
            for b in plan
        ]
    return plan


# ---- the driver -----------------------------------------------------------------------------------------------
def run(cfg) -> dict:
    """Run ``cfg`` on Ray (see the module's docstring); returns rank 0's last metrics record."""
    from asyncrl.launch.resume import resume_point
    from asyncrl.launch.signals import GracefulStop
    from asyncrl.models.hf import check_model_dir

    # refused before anything starts; the run directory is read here (the ranks' working directory is this one)
    model_path = str(Path(check_model_dir(cfg.model.path)).resolve())
    point = resume_point(cfg)
    try:
        import ray
    except ImportError:
        raise ConfigError("launcher=ray needs the ray package: pip install 'asyncrl[ray]'") from None
    own = not ray.is_initialized()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGCHLD, signal.SIGTERM)}
    try:
        started = own and _connect(ray, cfg.cluster.ray_address)
        # SIGINT/SIGTERM (taken back from Ray): the launch raises StopRequested within a second (the CLI's exit
        # 130/143), and the cleanup below stops rank 0 at a step boundary, with a checkpoint; a second signal
        # exits at once
        with GracefulStop() as stop:
            launch = _Launch(ray, cfg, model_path, local=started, resume=str(point.resolve()) if point else "")
            stop.buffer = launch  # it takes the signal as a failure (``fail``), as a run's buffer does
            try:
                return launch.run()
            finally:
                launch.close()
    finally:
        if own and ray.is_initialized():
            ray.shutdown()  # ends a Ray this process started; disconnects from a cluster
        _restore(saved)


def _restore(saved: dict) -> None:
    """Put back the signal dispositions ``ray.init`` changed for good: it ignores SIGCHLD in the driver (so every
    later child's exit status would read as 0, in this process and its children) and installs a SIGTERM handler."""
    for sig, handler in saved.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _connect(ray, address: str) -> bool:
    """Connect to the cluster at ``address``, or start a Ray on this machine (True)."""
    if address:
        log.info("connecting to the Ray cluster at %s", address)
        ray.init(address=address, logging_level=logging.WARNING)
        return False
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    log.info("starting a local Ray with %d CPUs", cpus)
    # address="local": a new Ray even if one runs here already; the raylet reaps what a dead actor leaves
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        _system_config={"kill_child_processes_on_worker_exit_with_raylet_subreaper": True},
    )
    return True


class _Launch:
    """The placement group, its actors and the processes they supervise; ``close`` undoes all of it."""

    def __init__(self, ray, cfg, model_path: str, local: bool, resume: str):
        self.ray, self.cfg, self.model_path, self.local = ray, cfg, model_path, local
        self.resume = resume  # the checkpoint every rank continues from ("" = none)
        self.pg = None
        self.ranks: list = []
        self.servers: list = []
        self.stopped: BaseException | None = None  # a signal's StopRequested, raised by the next wait

    def fail(self, error: BaseException) -> None:
        """From a signal handler (``GracefulStop``): stop at the next check; nothing is raised in Ray's code."""
        self.stopped = error

    def _get(self, refs: list, timeout: float | None = None) -> list:
        """``ray.get(refs)`` in slices of a second, raising a signal's ``StopRequested`` in between, and
        ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.stopped is not None:
                raise self.stopped
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"not done within {timeout:g} s")
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=1.0 if left is None else min(1.0, left))
            if len(ready) == len(refs):
                return self.ray.get(refs)

    def run(self) -> dict:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray, cfg = self.ray, self.cfg
        resources = ray.cluster_resources()
        device = cfg.cluster.device
        if device == "auto":
            device = "cuda" if resources.get("GPU", 0) > 0 else "cpu"
        plan = bundle_plan(cfg, device, cpus=resources.get("CPU", 1.0) if self.local else None)
        log.info("placement group: %s", ", ".join(f"{b.role} {b.index} {b.resources}" for b in plan))
        self.pg = placement_group([b.resources for b in plan], strategy="PACK")
        timeout = cfg.rollout.server_startup_timeout_s
        try:
            self._get([self.pg.ready()], timeout)
        except TimeoutError:
            raise ConfigError(
                f"launcher=ray: the placement group ({[b.resources for b in plan]}) was not placed "
                f"within rollout.server_startup_timeout_s={timeout:g} s on the cluster's resources "
                f"{resources}: lower actor.backend/rollout.backend or the threads, or add nodes"
            ) from None
        actor = ray.remote(max_restarts=0)(Supervisor)
        handles = []
        for i, b in enumerate(plan):
            handles.append(
                actor.options(
                    num_cpus=b.resources["CPU"],
                    num_gpus=b.resources.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
                ).remote(b.role, b.index, ray.util.get_node_ip_address)
            )
        self.ranks = [h for h, b in zip(handles, plan) if b.role == "trainer"]
        self.servers = [h for h, b in zip(handles, plan) if b.role == "server"]

        # every address is known before anything starts (servers on ports chosen on their nodes), so the servers
        # and the ranks start together; rank 0's engine waits for the servers' /health, the other ranks for rank 0
        (master_addr, free_port), *server_nodes = self._get([h.node.remote() for h in self.ranks[:1] + self.servers])
        urls = [f"http://{ip}:{port}" for ip, port in server_nodes]
        rollout = cfg.rollout.placement
        server_refs = [
            s.start_server.remote(
                cfg.rollout,
                rollout.kind,
                rollout.tp,
                self.model_path,
                cfg.model.dtype,
                self._max_len(),
                cfg.seed + i,
                port,
                device == "cuda",
            )
            for i, (s, (_, port)) in enumerate(zip(self.servers, server_nodes))
        ]
        env = {**self._rank_env(master_addr, cfg.cluster.master_port or free_port), RESUME_ENV: self.resume}
        self._get(
            [
                h.start_rank.remote(
                    self._rank_config(urls if r == 0 else None, master_addr),
                    {**env, "RANK": str(r), RANK_ENV: str(r)},
                    os.getcwd(),
                )
                for r, h in enumerate(self.ranks)
            ]
        )
        try:
            self._get(server_refs, timeout + 30)
        except (ray.exceptions.RayError, TimeoutError) as e:
            raise ConfigError(
                f"rollout.backend={cfg.rollout.backend}: the inference servers did not start: {_cause(e)}"
            ) from None
        if urls:
            log.info("inference servers: %s", ", ".join(urls))
        return self._wait()

    def _wait(self) -> dict:
        """Rank 0's result once it exits with 0; a rank that fails stops the run with its last output line."""
        while True:
            codes = self._get([h.wait.remote(POLL_S) for h in self.ranks])
            for r, code in enumerate(codes):
                if code not in (None, 0):
                    raise self._failure(r, code)
            if codes[0] == 0:
                result = self._get([self.ranks[0].result.remote(self._run_dir())])[0]
                for r, h in enumerate(self.ranks[1:], 1):  # they end when rank 0 closes its trainer
                    code = self._get([h.wait.remote(60.0)])[0]
                    if code not in (None, 0):
                        raise self._failure(r, code)
                return result

    def _failure(self, rank: int, code: int) -> Exception:
        """What the driver raises for a rank that exited with ``code``: a start-up refusal as its one line, a
        rank stopped by a signal as that stop, else the rank's last line."""
        from asyncrl.launch.signals import StopRequested

        lines = self.ray.get(self.ranks[rank].tail.remote())
        last = next((ln for ln in reversed(lines) if ln.strip()), "")
        prefix = "asyncrl train: error: "
        if code == 2 and last.startswith(prefix):  # the same one line as a local run
            return ConfigError(last[len(prefix) :])
        if code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and "stopped by SIG" in last:
            return StopRequested(code - 128)
        return RuntimeError(
            f"launcher=ray: trainer rank {rank} exited with code {code}"
            + (f": {last.strip()}" if last else "")
            + " (its output is above)"
        )

    def close(self) -> None:
        """Stop rank 0 (SIGINT: it ends the run at the next step boundary, with a checkpoint, and tells the other
        ranks to stop), then the other ranks, then the servers; kill every actor; remove the placement group.
        Never raises."""
        ray = self.ray
        for group, sequence in ((self.ranks[:1], RANK_0_STOP), (self.ranks[1:], RANK_STOP), (self.servers, ())):
            refs = [h.stop.remote(sequence) for h in group]
            try:
                ray.get(refs, timeout=STOP_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - an actor that died has nothing left to stop
                log.warning("launcher=ray: stopping: %s", _cause(e))
        for h in self.ranks + self.servers:
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001
                pass
        self.ranks, self.servers = [], []
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001
                pass
            self.pg = None

    # ---- what each process gets -------------------------------------------------------------------------------
    def _rank_config(self, urls: list[str] | None, master_addr: str) -> str:
        """The run's config as the ranks run it: rank 0's (``urls`` given) has the servers as ``remote`` at
        ``urls`` and the dist transport's address on its node; no progress bar (the output reaches the driver
        line by line)."""
        cfg = self.cfg
        rollout = cfg.rollout
        if urls is not None and rollout.placement.kind in SERVER_KINDS:
            rollout = dataclasses.replace(
                rollout, backend="remote", server_addrs=list(urls), server_api=rollout.resolved_api
            )
        if (
            urls is not None
            and rollout.resolved_transport == "dist"
            and rollout.dist_master_addr in ("127.0.0.1", "localhost")
        ):
            rollout = dataclasses.replace(rollout, dist_master_addr=master_addr)
        from asyncrl import configlib

        return yaml.safe_dump(
            configlib.to_dict(dataclasses.replace(cfg, rollout=rollout, progress_bar=False)), sort_keys=False
        )

    def _rank_env(self, master_addr: str, port: int) -> dict:
        """The torchrun environment (one visible GPU per rank: LOCAL_RANK 0), the driver's import path (for
        reward functions and workflows named by import path) and ``FORWARDED_ENV``."""
        paths = [
            p or os.getcwd()
            for p in sys.path
            if not p or not p.startswith((sys.prefix, sys.base_prefix, sys.exec_prefix))
        ]
        paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
        return {
            "WORLD_SIZE": str(self.cfg.actor.world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port),
            "LOCAL_RANK": "0",
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
            **{k: os.environ[k] for k in FORWARDED_ENV if k in os.environ},
        }

    def _max_len(self) -> int:
        """The engines' context, as ``launch.build.RunShape`` computes it."""
        from transformers import AutoConfig

        from asyncrl.launch.shape import context_len

        return context_len(
            self.cfg.rollout,
            AutoConfig.from_pretrained(self.model_path).max_position_embeddings,
            self.cfg.gconfig.max_new_tokens,
        )

    def _run_dir(self) -> str:
        return str(Path(self.cfg.output_dir) / self.cfg.experiment_name / self.cfg.trial_name)


def _cause(e: BaseException) -> str:
    """The original error of a Ray failure, in one line."""
    cause = getattr(e, "cause", None) or e
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
