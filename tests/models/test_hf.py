"""Finding a checkpoint (asyncrl.models.hf): a run directory names its latest checkpoint, and a hub name resolves from
the local Hugging Face cache without a download."""

import shutil

import pytest

from asyncrl.models.hf import check_model_dir, resolve_model_path


def test_a_run_directory_and_its_latest_pointer_name_the_latest_checkpoint(tmp_path, tiny_model_dir):
    run = tmp_path / "outputs" / "asyncrl" / "default"
    for step in ("step2", "step3"):
        shutil.copytree(tiny_model_dir, run / "checkpoints" / step)
    (run / "checkpoints" / "latest").write_text("step3\n")
    want = str(run / "checkpoints" / "step3")
    assert resolve_model_path(str(run)) == want
    assert resolve_model_path(str(run / "checkpoints" / "latest")) == want
    assert check_model_dir(str(run)) == want
    assert resolve_model_path(str(run / "checkpoints" / "step2")) == str(run / "checkpoints" / "step2")
    (run / "checkpoints" / "latest").write_text("../../elsewhere")  # a pointer out of the run is not followed
    assert resolve_model_path(str(run)) == str(run)


def test_a_hub_name_resolves_from_the_local_cache_only(tmp_path, monkeypatch, tiny_model_dir):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--tiny-org--tiny-model"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert resolve_model_path("tiny-org/tiny-model") == str(repo / "snapshots" / "abc123")
    with pytest.raises(FileNotFoundError, match="never downloaded.*local Hugging Face cache"):
        resolve_model_path("tiny-org/not-cached")


def test_a_lora_adapter_directory_is_as_small_as_its_base_model(tmp_path, tiny_model_dir):
    """is_small_model decides per-model defaults (e.g. max_new_tokens 96 or 1024): an adapter directory has no
    config.json of its own and counted as small whatever its base."""
    import json

    from asyncrl.models.hf import is_small_model

    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(
        json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 151936, "intermediate_size": 11008})
    )
    for base, small in ((big, False), (tiny_model_dir, True)):
        adapter = tmp_path / f"adapter-{small}"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
        assert is_small_model(str(adapter)) is small and is_small_model(str(base)) is small
