"""Shared-prefix training (asyncrl.trainer.sharing): the prefix-tree layout by hand, its plan within the budget, and
the same logits, log-probs, gradients and updates as the padded computation in every pass that uses it."""

import copy

import pytest
import torch

from asyncrl.algo.advantages import gae
from asyncrl.algo.algorithm import Algorithm
from asyncrl.algo.kl import k1
from asyncrl.data.collate import collate
from asyncrl.trainer import PolicyTrainer
from asyncrl.trainer.forward import Forward
from asyncrl.trainer.sharing import common_prefix, lay_out, plan_shared, shared_forward, sharing_problem, tree_sizes
from asyncrl.types import Trajectory, TrajectoryGroup

from conftest import make_model


def test_common_prefix_and_tree_sizes_by_hand():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2  # one is a prefix of the other
    assert common_prefix([7], [8]) == 0 and common_prefix([], [1]) == 0
    # [1,2,3] alone; [1,2,4,5] shares 2 -> 2 new; [1,2,4,5,6] shares 4 -> 1 new; [9] shares none
    assert tree_sizes([[1, 2, 3], [1, 2, 4, 5], [1, 2, 4, 5, 6], [9]]) == [3, 2, 1, 1]


def test_plan_sorts_neighbours_together_and_cuts_trees_at_the_row_limit():
    seqs = [[5, 1, 1], [1, 2, 3], [5, 1, 2], [1, 2, 4]]
    # sorted: [1,2,3] [1,2,4] [5,1,1] [5,1,2]: 3 + 1 + 3 + 1 = 8 positions, one row when rows may be 8 wide
    assert plan_shared(seqs, max_tokens=8, row_tokens=8) == [[[1, 3, 0, 2]]]
    # rows of 4: two trees of 4 positions, two rows in one micro-batch of 8 positions
    assert plan_shared(seqs, max_tokens=8, row_tokens=4) == [[[1, 3], [0, 2]]]
    # a row limit of 3 cuts each pair: [1,2,3] alone (3), [1,2,4] alone, ... four rows of 3 in two micro-batches
    assert plan_shared(seqs, max_tokens=6, row_tokens=3) == [[[1], [3]], [[0], [2]]]
    assert plan_shared([], 8) == []


def test_plan_counts_computed_positions_so_a_micro_batch_holds_more_shared_samples():
    prompt = list(range(1, 21))
    seqs = [prompt + [100 + i] for i in range(8)]  # 8 samples of 21 tokens: 168 padded, 28 shared
    plan = plan_shared(seqs, max_tokens=32, row_tokens=32)
    assert plan == [[list(range(8))]]  # one row of 28 positions holds them all
    assert sum(len(seqs[i]) for i in range(8)) > 32  # which the padded budget would have split


def test_lay_out_by_hand():
    ids = torch.tensor([[1, 2, 3, 0], [1, 2, 4, 5], [9, 8, 0, 0]])
    shared = lay_out(ids, [3, 4, 2], [[0, 1], [2]])
    # row 0: 1 2 3 | 4 5 (sample 1 reuses 1 2); row 1: 9 8, padded to width 5
    assert shared.input_ids.tolist() == [[1, 2, 3, 4, 5], [9, 8, 0, 0, 0]]
    assert shared.position_ids.tolist() == [[0, 1, 2, 2, 3], [0, 1, 0, 0, 0]]
    m = shared.mask[:, 0].int().tolist()
    assert m[0] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
    assert m[1] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    # targets: sample 0 reads columns 0, 1 (predicting 2, 3); sample 1 columns 0, 1, 3 (predicting 2, 4, 5):
    # column 1 is shared and predicts 3 for one sample, 4 for the other; sample 2 column 0 of row 1
    got = sorted(zip(shared.dst[0].tolist(), shared.dst[1].tolist(), shared.src[1].tolist(), shared.targets.tolist()))
    assert got == [(0, 0, 0, 2), (0, 1, 1, 3), (1, 0, 0, 2), (1, 1, 1, 4), (1, 2, 3, 5), (2, 0, 0, 8)]
    assert shared.positions == 7 and shared.n_slots == 10


def test_a_sample_that_is_a_prefix_of_the_next_or_a_copy_adds_only_what_is_new():
    ids = torch.tensor([[1, 2, 0, 0], [1, 2, 3, 4], [1, 2, 3, 4]])  # an agent's calls, then a duplicate
    shared = lay_out(ids, [2, 4, 4], [[0, 1, 2]])
    assert shared.input_ids.tolist() == [[1, 2, 3, 4]] and shared.positions == 4


def _batch(seed=0, n_groups=4, group=4, chains=True):
    """Groups whose samples share their prompt (and some their first output tokens); with ``chains`` a group
    whose samples are an agent's calls (each one's prompt the previous one's prompt and output)."""
    g = torch.Generator().manual_seed(seed)

    def rand(lo, hi):
        return torch.randint(1, 300, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()

    groups = []
    for k in range(n_groups):
        prompt, head = rand(2, 9), rand(0, 4)
        trajs = []
        for j in range(group):
            out = (head if j % 2 else []) + rand(1, 10)
            trajs.append(Trajectory(prompt, out, [-5.7] * len(out), [k % 3] * len(out), float((k + j) % 3)))
        groups.append(TrajectoryGroup(trajs))
    if chains:
        history, trajs = rand(3, 6), []
        for j in range(3):
            out = rand(2, 6)
            trajs.append(Trajectory(list(history), out, [-5.7] * len(out), [1] * len(out), float(j % 2)))
            history = history + out + rand(1, 3)  # the tool's result, then the next call
        groups.append(TrajectoryGroup(trajs))
    return collate(groups, pad_id=0)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_tree_forward_gives_each_sample_its_own_logits(impl):
    model = make_model()
    model.config._attn_implementation = impl
    model.eval()
    batch = _batch()
    n = batch.input_ids.shape[0]
    lengths = batch.attention_mask.sum(-1).tolist()
    (rows,) = plan_shared([batch.input_ids[i, : lengths[i]].tolist() for i in range(n)], 10_000, 10_000)
    shared = lay_out(batch.input_ids, lengths, rows)
    assert shared.positions < sum(lengths)
    with torch.no_grad():
        logits = shared_forward(model, shared).logits[shared.src]
        for i in range(n):
            alone = model(input_ids=batch.input_ids[i : i + 1, : lengths[i]]).logits[0, :-1]
            mine = shared.dst[0] == i
            assert torch.allclose(logits[mine][shared.dst[1][mine].argsort()], alone, atol=1e-5)


@pytest.mark.parametrize("budget", [10_000, 24, 8])
@pytest.mark.parametrize("pack", [True, False])
def test_forward_outputs_equal_the_padded_ones(budget, pack):
    model = make_model()
    batch = _batch(1)
    n = batch.input_ids.shape[0]
    padded = Forward(torch.device("cpu"), budget, pack_sequences=False, top_p=0.9, top_k=50, temperature=0.7)
    shared = Forward(
        torch.device("cpu"), budget, pack_sequences=pack, top_p=0.9, top_k=50, temperature=0.7, shared_prefix=True
    )
    want, got = torch.zeros(n, batch.input_ids.shape[1] - 1, 3), torch.zeros(n, batch.input_ids.shape[1] - 1, 3)
    computed = {}
    for fwd, out in ((padded, want), (shared, got)):
        computed[fwd is shared] = 0
        for _, ids, rows in fwd.micro_batches(batch, list(range(n))):
            o = fwd.run(model, batch, ids, rows, entropy=True, hidden=True)
            L = o.target_len
            out[ids, :L, 0], out[ids, :L, 1], out[ids, :L, 2] = o.logprobs, o.entropy, o.hidden[..., 0]
            computed[fwd is shared] += o.positions
    mask = batch.attention_mask[:, 1:].bool()
    assert torch.allclose(got[mask], want[mask], atol=1e-5)
    assert computed[True] < computed[False] == batch.n_tokens


def _update(**kw):
    """The weights' change after one SGD step of a PolicyTrainer on _batch(), and its stats."""
    torch.manual_seed(0)
    trainer = PolicyTrainer(make_model(seed=7), lr=1e-2, max_grad_norm=0.0, **kw)
    trainer.optimizer = torch.optim.SGD(trainer.optimizer.param_groups[0]["params"], lr=1.0)
    before = {k: v.clone() for k, v in trainer.state_dict().items()}
    stats = trainer.step(_batch(2), version=1)
    return {k: v - before[k] for k, v in trainer.state_dict().items()}, stats, trainer


CASES = {
    "one-minibatch": {},
    "two-minibatches (proximal pass)": {"ppo_n_minibatches": 2},
    "small micro-batches": {"mb_max_tokens": 16},
    "reference model, KL in the loss": {"kl": True},
    "value head (GAE)": {"critic": "value_head"},
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_step_with_shared_prefixes_makes_the_padded_update(case):
    kw = dict(CASES[case])
    if kw.pop("kw", None) or kw.pop("kl", False):
        kw["ref_model"] = make_model(seed=11)
        kw["algo"] = Algorithm(kl_fn=k1, kl_ctl=0.3, kl_in_loss=True)
    if kw.get("critic"):
        kw["algo"] = Algorithm(adv_fn=gae, gamma=1.0, lam=0.95)
    want, want_stats, _ = _update(pack_sequences=False, **copy.deepcopy(kw))
    got, stats, trainer = _update(pack_sequences=True, shared_prefix=True, **kw)
    assert trainer.forward.shared_prefix and stats["prefix_shared_frac"] > 0.2
    assert stats["train_positions"] < want_stats["train_positions"]
    for name, w in want.items():
        assert torch.allclose(got[name], w, atol=1e-5), (name, float((got[name] - w).abs().max()))
    assert max(float(w.abs().max()) for w in want.values()) > 1e-4  # the update was not empty
    assert stats["loss"] == pytest.approx(want_stats["loss"], abs=1e-5)


def test_a_separate_critic_trains_as_without_sharing():
    from transformers import Qwen2Model

    def critic_after(shared):
        torch.manual_seed(0)
        critic = Qwen2Model(make_model(seed=3).config)
        trainer = PolicyTrainer(
            make_model(), Algorithm(adv_fn=gae), critic="separate", critic_model=critic, shared_prefix=shared
        )
        for _ in range(2):  # the zero-initialised head gives the trunk its first gradient on the second step
            stats = trainer.step(_batch(3))
        assert (stats["prefix_shared_frac"] > 0) == shared
        return critic.state_dict()

    want, got = critic_after(False), critic_after(True)
    assert all(torch.allclose(got[k], v, atol=1e-5) for k, v in want.items())


def test_lora_adapters_train_as_without_sharing():
    pytest.importorskip("peft")
    from trainers_for_tests import lora_model

    def adapters_after(shared):
        trainer = PolicyTrainer(lora_model(), lr=1e-2, max_grad_norm=0.0, shared_prefix=shared)
        trainer.module.eval()  # no dropout: both runs see the same network
        trainer.step(_batch(4))
        assert trainer.forward.shared_prefix == shared
        return {k: v.clone() for k, v in trainer.module.named_parameters() if "lora_" in k}

    want, got = adapters_after(False), adapters_after(True)
    assert want and all(torch.allclose(got[k], v, atol=1e-5) for k, v in want.items())


def test_a_model_whose_attention_ignores_the_tree_mask_trains_without_sharing():
    model = make_model()
    assert sharing_problem(model) is None
    flash = make_model()
    flash.config._attn_implementation = "flash_attention_2"
    assert "takes no tree mask" in sharing_problem(flash)
    windowed = make_model()
    windowed.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding-window" in sharing_problem(windowed)

    class IgnoresMask(torch.nn.Module):  # plain causal attention whatever the mask says
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def get_input_embeddings(self):
            return self.inner.get_input_embeddings()

        def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=False, **kw):
            return self.inner(input_ids=input_ids, use_cache=False, **kw)

    assert "does not follow a tree mask" in sharing_problem(IgnoresMask(model))
    trainer = PolicyTrainer(IgnoresMask(make_model()), pack_sequences=False, shared_prefix=True)
    assert trainer.sharing_off and not trainer.forward.shared_prefix


def test_a_sample_that_shares_little_starts_a_new_tree_when_a_wider_row_would_cost_more():
    """Two samples of 100 tokens sharing 2: one tree of 198 positions costs 198 x (1 + 198 / W) against
    100 x (1 + 100 / W) for the second on its own; with W = 600 (attention a sixth of the cost at 100 keys) the
    cut is cheaper, with W = 1e9 (attention free) sharing wins. A group sharing 90 of 100 tokens stays one tree."""
    a, b = [1, 2] + [3] * 98, [1, 2] + [4] * 98
    assert plan_shared([a, b], 10_000, attention_width=600) == [[[0], [1]]]
    assert plan_shared([a, b], 10_000, attention_width=1e9) == [[[0, 1]]]
    c, d = [5] * 90 + [6] * 10, [5] * 90 + [7] * 10
    assert plan_shared([c, d], 10_000, attention_width=600) == [[[0, 1]]]
