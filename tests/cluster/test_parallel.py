"""Several trainer ranks give the update of one (asyncrl.cluster.parallel): DDP and FSDP2 over gloo, 2 processes,
against one process on the whole batch, including a batch that does not split evenly; shards are whole groups balanced
by tokens."""

import pytest
import torch

from asyncrl.cluster.parallel import shard_groups
from asyncrl.launch.ranks import split

from trainers_for_tests import PARALLEL_CASES, ranked_trainer, varied_batch


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", list(PARALLEL_CASES))
def test_two_ranks_give_the_update_of_one(mode, case, two_trainer_ranks):
    """Two ranks (spawned once for all cases: the two_trainer_ranks fixture) against one process on the whole
    batch."""
    kw = PARALLEL_CASES[case]
    torch.manual_seed(0)
    single = ranked_trainer(**dict(kw))
    before = {k: v.clone() for k, v in single.state_dict().items()}
    stats = single.step(varied_batch(shared=kw.get("shared_prefix", False)))
    weights, parallel_stats = two_trainer_ranks[f"{case}-{mode}"]
    moved = 0.0
    for name, w in single.state_dict().items():
        got = torch.from_numpy(weights[name])
        assert torch.allclose(got, w, atol=1e-5, rtol=1e-4), (
            name,
            float((got - w).abs().max()),
            float((w - before[name]).abs().max()),
        )
        moved = max(moved, float((w - before[name]).abs().max()))
    assert moved > 1e-6  # the update was not empty
    assert parallel_stats["loss"] == pytest.approx(stats["loss"], abs=1e-5)
    assert parallel_stats["train_tokens"] == stats["train_tokens"]
    if kw.get("shared_prefix"):
        assert stats["prefix_shared_frac"] > 0.1 and parallel_stats["prefix_shared_frac"] > 0.1


def test_shards_are_whole_groups_balanced_by_tokens():
    loads = [sum([10, 1, 1, 1, 9][i] for i in s) for s in shard_groups([10, 1, 1, 1, 9], 2)]
    assert sorted(loads) == [11, 11]
    with pytest.raises(ValueError, match="cannot feed"):
        shard_groups([1], 2)
    batch = varied_batch()
    shards = split(batch, 2)
    assert sum(s.input_ids.shape[0] for s in shards) == batch.input_ids.shape[0]
    for s in shards:
        assert s.loss_mask.shape[1] == s.input_ids.shape[1] - 1 == s.behav_logprobs.shape[1]
        assert int(s.attention_mask.sum(-1).max()) == s.input_ids.shape[1]  # trimmed to its own longest row
        for g in s.group_ids.unique():  # whole groups
            assert int((s.group_ids == g).sum()) == int((batch.group_ids == g).sum())
