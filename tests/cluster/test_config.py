"""The cluster section (asyncrl.cluster.config): the device resolves to the CPU without a GPU, and asking for
CUDA without one is refused with the fix."""

import pytest
import torch

from asyncrl.cluster.config import ClusterConfig
from asyncrl.configlib import ConfigError


def test_device_falls_back_to_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ClusterConfig().resolved_device() == "cpu"
    with pytest.raises(ConfigError, match="no CUDA device"):
        ClusterConfig(device="cuda").resolved_device()
