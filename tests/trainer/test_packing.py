"""Sequence packing: first-fit-decreasing bins, the packed layout and its way back."""

import pytest
import torch

from asyncrl.trainer.packing import (
    check_packing,
    first_fit_decreasing,
    pack,
    packed_forward,
    plan_micro_batches,
    unpack,
)


def test_ffd_by_hand():
    # decreasing: 5 -> bin 0 (3 left), 4 -> bin 1 (4 left), 3 -> bin 0 (full), 3 -> bin 1 (1 left),
    # 2 -> bin 2, 1 -> bin 1 (full)
    assert first_fit_decreasing([5, 4, 3, 3, 2, 1], 8) == [[0, 2], [1, 3, 5], [4]]


def test_ffd_respects_capacity_and_places_every_item_once():
    g = torch.Generator().manual_seed(0)
    sizes = (torch.rand(200, generator=g) ** 3 * 500).long().add(1).tolist()  # long-tailed
    bins = first_fit_decreasing(sizes, 600)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(sizes[i] for i in b) <= 600 for b in bins)
    assert len(bins) <= 11 / 9 * (sum(sizes) / 600) + 1 + 6 / 9  # within FFD's 11/9 OPT + 6/9 of the volume bound


def test_ffd_raises_on_an_oversize_item_and_plan_gives_it_its_own_micro_batch():
    with pytest.raises(ValueError, match="exceeds the bin capacity"):
        first_fit_decreasing([3, 9], 8)
    assert plan_micro_batches([3, 9, 4], 8) == [[[1]], [[2], [0]]]
    assert plan_micro_batches([], 8) == []


def test_plan_by_hand():
    # budget 20: the first micro-batch is 10 wide with 2 rows: [10] and [6, 4]; 3 and 2 no longer fit;
    # the second is 3 wide: [3] and [2]
    assert plan_micro_batches([10, 6, 4, 3, 2], 20) == [[[0], [1, 2]], [[3], [4]]]


def test_plan_keeps_the_padded_budget_and_never_widens_a_row():
    g = torch.Generator().manual_seed(1)
    lengths = (torch.exp(torch.randn(300, generator=g)) * 60).long().clamp(5, 1000).tolist()
    plan = plan_micro_batches(lengths, 2048)
    assert sorted(i for mb in plan for row in mb for i in row) == list(range(300))
    for mb in plan:
        width = max(lengths[i] for row in mb for i in row)
        assert all(sum(lengths[i] for i in row) <= width for row in mb)  # as wide as its longest sample
        assert len(mb) * width <= max(2048, width)
    padded_slots = sum(len(mb) * max(lengths[i] for i in mb) for mb in _padded(lengths, 2048))
    packed_slots = sum(len(mb) * max(lengths[i] for row in mb for i in row) for mb in plan)
    assert packed_slots < padded_slots


def _padded(lengths, budget):
    from asyncrl.trainer.packing import micro_batches

    return micro_batches(lengths, budget)


def test_pack_layout_and_unpack_round_trip():
    ids = torch.tensor([[11, 12, 13, 0, 0], [21, 22, 0, 0, 0], [31, 32, 33, 34, 35]])
    packed = pack(ids, [3, 2, 5], pad_id=0)
    # width = 5: sample 2 alone in row 0; samples 0 and 1 share row 1
    assert packed.input_ids.tolist() == [[31, 32, 33, 34, 35], [11, 12, 13, 21, 22]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    # targets of a packed row: column c predicts token c + 1; the boundary column 2 (13 -> 21) is not used
    targets = packed.input_ids[:, 1:].float()
    back = unpack(targets, packed, fill=-1.0)
    assert back.tolist() == [[12, 13, -1, -1], [22, -1, -1, -1], [32, 33, 34, 35]]
    assert packed.n_slots == 10


def test_pack_pads_rows_with_positions_restarting_from_zero():
    packed = pack(torch.tensor([[1, 2, 3, 4, 0], [5, 6, 0, 0, 0], [7, 0, 0, 0, 0]]), [4, 2, 1], rows=[[0], [1, 2]])
    assert packed.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]  # the padding is a dummy sample
    assert unpack(packed.input_ids[:, 1:], packed).tolist() == [[2, 3, 4, 0], [6, 0, 0, 0], [0, 0, 0, 0]]


def test_unpack_is_differentiable():
    packed = pack(torch.tensor([[1, 2, 3], [4, 5, 0]]), [3, 2], rows=[[0, 1]])
    x = torch.arange(4.0).reshape(1, 4).requires_grad_()
    unpack(x, packed).sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0, 0.0, 1.0]]  # column 2 is the boundary between the samples


def test_check_packing_accepts_hf_models_and_refuses_one_that_mixes_samples():
    from conftest import make_model

    model = make_model()
    check_packing(model)
    check_packing(make_model(model_type="llama"))

    class IgnoresPositions(torch.nn.Module):  # attends across packed samples: plain causal attention
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def get_input_embeddings(self):
            return self.inner.get_input_embeddings()

        def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=False):
            return self.inner(input_ids=input_ids, use_cache=False)

    with pytest.raises(RuntimeError, match="pack_sequences=false"):
        check_packing(IgnoresPositions(model))


def test_packed_forward_matches_separate_forwards():
    from conftest import make_model

    model = make_model()
    a, b = torch.randint(0, 320, (7,)), torch.randint(0, 320, (4,))
    packed = pack(torch.stack([a, torch.cat([b, b[:3]])]), [7, 4], rows=[[0, 1]])
    logits = packed_forward(model, packed).logits
    with torch.no_grad():
        assert torch.allclose(logits[0, :7], model(input_ids=a[None]).logits[0], atol=1e-5)
        assert torch.allclose(logits[0, 7:], model(input_ids=b[None]).logits[0], atol=1e-5)
