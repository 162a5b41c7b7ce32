"""Batches, trainers, and two trainer ranks in spawned processes (two_trainer_ranks: the updates test_parallel and
test_lora compare with one process's). The ranks' functions live here, not in a test module, because a spawned
process imports its target by module name: this one is importable as ``trainers_for_tests`` wherever tests/ is
on the path."""

import os
import socket

import torch

from conftest import make_model


def varied_batch(n_groups=5, seed=0, shared=False):
    """Groups of 3 samples with different lengths and rewards (5 groups over 2 ranks: uneven); with ``shared`` the
    samples of a group have its prompt in common."""
    from asyncrl.data.collate import collate
    from asyncrl.types import Trajectory, TrajectoryGroup

    g = torch.Generator().manual_seed(seed)
    groups = []
    for k in range(n_groups):
        trajs = []
        for j in range(3):
            if not (shared and j):
                p = torch.randint(1, 300, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
            o = torch.randint(1, 300, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
            trajs.append(Trajectory(p, o, [-1.5] * len(o), [0] * len(o), float((k + j) % 3)))
        groups.append(TrajectoryGroup(trajs))
    return collate(groups, pad_id=0)


def make_batch(lengths, prompt=6, vocab=320, seed=0, group_size=4):
    """Right-padded rows of random tokens: the first ``prompt`` are the prompt, the rest the completion."""
    from asyncrl.types import Batch

    g = torch.Generator().manual_seed(seed)
    N, T = len(lengths), max(lengths)
    ids = torch.zeros(N, T, dtype=torch.long)
    attn = torch.zeros(N, T, dtype=torch.long)
    loss_mask = torch.zeros(N, T - 1)
    for i, L in enumerate(lengths):
        ids[i, :L] = torch.randint(1, vocab, (L,), generator=g)
        attn[i, :L] = 1
        loss_mask[i, prompt - 1 : L - 1] = 1
    behav = (torch.randn(N, T - 1, generator=g) * 0.3 - 5.0) * loss_mask
    versions = torch.where(loss_mask > 0, torch.randint(0, 3, (N, T - 1), generator=g), -1)
    rewards = torch.rand(N, generator=g).round()
    return Batch(
        ids, attn, loss_mask, behav, versions, rewards, torch.arange(N) // group_size, torch.zeros(N, dtype=torch.bool)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranked_trainer(dp=None, **kw):
    """AdamW, or SGD (``sgd=True``): AdamW's first steps turn float noise in gradients that are nearly zero
    into updates of up to ±lr, so multi-step comparisons use SGD, whose update is the gradient itself."""
    from asyncrl.trainer import PolicyTrainer

    sgd = kw.pop("sgd", False)
    trainer = PolicyTrainer(
        make_model(320, seed=7), lr=1e-2, max_grad_norm=0.0, dp=dp, pack_sequences=kw.pop("pack", True), **kw
    )
    if sgd:
        trainer.optimizer = torch.optim.SGD(trainer.optimizer.param_groups[0]["params"], lr=1.0)
    return trainer


def _join(rank, world, port):
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    torch.set_num_threads(1)


PARALLEL_CASES = {
    "one-minibatch": {},
    "two-minibatches": {"ppo_n_minibatches": 2, "sgd": True},
    # 5 groups in 4 minibatches over 2 ranks: a rank holds none of some minibatch (it crashed)
    "four-minibatches": {"ppo_n_minibatches": 4, "sgd": True},
    "padded-micro-batches": {"pack": False, "mb_max_tokens": 24},
    "shared-prefix": {"shared_prefix": True},  # on varied_batch(shared=True): each group's prompt computed once
}
"""ranked_trainer's options of each case test_parallel compares (SGD for two minibatches: see ranked_trainer)."""


def _parallel_cases(rank, world, mode, out):
    """One step of each PARALLEL_CASES trainer on this rank's shard of varied_batch(); rank 0 puts
    (case-mode, weights, the ranks' combined stats) on ``out``."""
    from asyncrl.cluster import parallel
    from asyncrl.launch.ranks import combine, split

    dp = parallel.from_env(mode, torch.device("cpu"), timeout_s=120)
    for name, kw in PARALLEL_CASES.items():
        trainer = ranked_trainer(dp, **dict(kw))
        trainer.gather_weights()
        shard = split(varied_batch(shared=kw.get("shared_prefix", False)), world)[rank]
        stats = trainer.step(shard)
        trainer.gather_weights()
        all_stats = dp.gather(stats)
        if rank == 0:
            out.put(
                (
                    f"{name}-{mode}",
                    {k: v.detach().numpy().copy() for k, v in trainer.state_dict().items()},
                    combine(all_stats),
                )
            )


def _lora_case(rank, world, out):
    """lora_model()'s adapters trained one step by DDP on this rank's shard of varied_batch(5)."""
    from asyncrl.cluster import parallel
    from asyncrl.launch.ranks import combine, split
    from asyncrl.trainer import PolicyTrainer

    dp = parallel.from_env("ddp", torch.device("cpu"), timeout_s=120)
    trainer = PolicyTrainer(lora_model(), lr=1e-2, max_grad_norm=0.0, dp=dp, pack_sequences=True)
    stats = dp.gather(trainer.step(split(varied_batch(5), world)[rank]))
    if rank == 0:
        out.put(("lora-ddp", {k: v.numpy().copy() for k, v in trainer.state_dict().items()}, combine(stats)))


def _has_peft() -> bool:
    import importlib.util

    return importlib.util.find_spec("peft") is not None


def rank_cases(rank, world, port, out):
    """Trainer rank ``rank`` of ``world`` (one spawned process): every case, one after the other in one process
    group, DDP then FSDP2, then the LoRA case under DDP (when peft is installed)."""
    _join(rank, world, port)
    for mode in ("ddp", "fsdp"):
        _parallel_cases(rank, world, mode, out)
    if _has_peft():
        _lora_case(rank, world, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def two_trainer_ranks() -> dict:
    """case -> (rank 0's weights after one step, the ranks' combined stats), from two trainer ranks spawned once
    (starting a process costs seconds; a step of these models, milliseconds): every PARALLEL_CASES case as
    "<case>-ddp" and "<case>-fsdp", and "lora-ddp"."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_cases, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(2 * len(PARALLEL_CASES) + _has_peft()):
            case, weights, stats = out.get(timeout=240)
            results[case] = (weights, stats)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    return results


def lora_model(rank=8, seed=0, path=None):
    """A LoRA model with random (not zero) B, so that the adapters change the outputs and get every gradient."""
    from asyncrl.models.hf import load_model
    from asyncrl.models.lora import apply_lora

    model = load_model(path) if path else make_model(320, seed=7)
    torch.manual_seed(seed)
    model = apply_lora(model, rank=rank)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model
