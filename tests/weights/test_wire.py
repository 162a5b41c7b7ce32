"""The weight formats (asyncrl.weights.wire): atomic versioned safetensors directories, a damaged file named,
buckets that keep the order and respect their size."""

import os

import pytest
import torch

from asyncrl.weights.wire import buckets, read_weights, write_weights

from conftest import make_model


def test_write_read_round_trip_is_atomic_and_versioned(tmp_path):
    sd = make_model(seed=3).state_dict()
    path = write_weights(sd, tmp_path, 7)
    assert path.name == "v000007" and sorted(os.listdir(tmp_path)) == ["v000007"]  # no temporary left behind
    back = read_weights(path)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    tied = {"a": torch.ones(3), "b": None}
    tied["b"] = tied["a"]  # shared storage (tied embeddings) is written as two tensors
    assert torch.equal(read_weights(write_weights(tied, tmp_path, 8))["b"], torch.ones(3))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        read_weights(tmp_path / "v000007" / "..")


def test_buckets_respect_the_size_and_keep_order():
    sd = {f"w{i}": torch.zeros(n) for i, n in enumerate([10, 10, 30, 5, 5, 5])}
    groups = buckets(sd, bucket_bytes=80)
    assert groups == [["w0", "w1"], ["w2"], ["w3", "w4", "w5"]]  # a tensor larger than a bucket goes alone
    assert [n for g in groups for n in g] == list(sd)


def test_a_corrupt_weights_file_is_a_value_error_naming_it(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}" + b"\0" * 64)
    with pytest.raises(ValueError, match="model.safetensors.*not a readable safetensors file"):
        read_weights(tmp_path)
