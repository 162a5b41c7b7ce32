"""Placement (asyncrl.cluster.placement): backend strings parse, impossible allocations are refused with the reason, the
trainer is placed first, and a bad backend in one line."""

import pytest

from asyncrl.cluster.placement import PlacementError, allocate, parse


@pytest.mark.parametrize(
    "spec, key, kind, dp, tp",
    [
        ("local", "rollout.backend", "local", 1, 1),
        ("local:d1", "rollout.backend", "local", 1, 1),
        ("sglang:d4t2", "rollout.backend", "sglang", 4, 2),
        ("vllm:d2", "rollout.backend", "vllm", 2, 1),
        ("remote", "rollout.backend", "remote", 1, 1),
        ("ddp:d2", "actor.backend", "ddp", 2, 1),
        ("fsdp:d8", "actor.backend", "fsdp", 8, 1),
    ],
)
def test_placement_strings_parse(spec, key, kind, dp, tp):
    kinds = ("ddp", "fsdp") if key == "actor.backend" else ("local", "asyncrl", "sglang", "vllm", "remote")
    b = parse(spec, key, kinds)
    assert (b.kind, b.dp, b.tp) == (kind, dp, tp)


@pytest.mark.parametrize(
    "rollout, actor, n, match",
    [
        ("sglang:d4t2", "fsdp:d8", 8, "needs 8 device\\(s\\) and rollout.backend=sglang:d4t2 8: 16 in all"),
        ("tgi:d2", "ddp:d1", 8, "must start with one of"),
        ("local:d2", "ddp:d1", 8, "one engine"),
        ("vllm:d2x", "ddp:d1", 8, "cannot read the dimensions"),
        ("remote", "ddp:d2t2", 8, "no tensor parallelism"),
        ("remote:d2", "ddp:d1", 8, "takes no dimensions"),
    ],
)
def test_impossible_allocations_are_refused_with_the_reason(rollout, actor, n, match):
    with pytest.raises(PlacementError, match=match):
        allocate(rollout, actor, "cuda", n)


def test_allocation_places_trainer_first_then_servers():
    a = allocate("sglang:d2t2", "fsdp:d4", "cuda", 8)
    assert a.trainer_devices == ((0,), (1,), (2,), (3,)) and a.server_devices == ((4, 5), (6, 7))
    cpu = allocate("asyncrl:d2", "ddp:d2", "cpu", 0)
    assert cpu.world_size == 2 and cpu.server_devices == ((), ())


@pytest.mark.slow
def test_a_bad_backend_is_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "train", "actor.backend=ddp:d2t2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("asyncrl train: error: actor.backend: 'ddp:d2t2'")
