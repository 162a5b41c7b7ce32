"""The Slurm script (asyncrl.launch.slurm) starts a Ray cluster and runs the driver on the run's config."""

import subprocess

import pytest

pytest.importorskip("ray")

from asyncrl import configlib  # noqa: E402
from asyncrl.config import TrainConfig  # noqa: E402
from asyncrl.launch.slurm import sbatch_script  # noqa: E402


def _cfg(*extra):
    return configlib.load(TrainConfig, None, ["train_dataset.batch_size=4", *extra])


def test_sbatch_script_starts_a_ray_cluster_and_runs_the_driver(tmp_path):
    script = sbatch_script(
        _cfg(
            "actor.backend=ddp:d4", "rollout.backend=vllm:d2t2", "rollout.interrupt_mode=abort", "experiment_name=big"
        ),
        nodes=2,
        gpus_per_node=4,
        partition="gpu",
    )
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "--head",
        "--num-gpus=4",
        'launcher=ray cluster.ray_address="$HEAD_IP:$PORT"',
        "backend: vllm:d2t2",
    ):
        assert line in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    config = script.split("<<'ASYNCRL_CONFIG'\n")[1].split("\nASYNCRL_CONFIG")[0]
    (tmp_path / "c.yaml").write_text(config)
    assert configlib.load(TrainConfig, str(tmp_path / "c.yaml")).actor.backend == "ddp:d4"  # the config round-trips
