"""SFT's loss (asyncrl.commands.sft.loss): packed micro-batches give the padded loss and gradients."""

import torch

from asyncrl.commands.sft.examples import sft_batch
from asyncrl.commands.sft.loss import MICRO_BATCH_TOKENS, micro_batch_losses
from asyncrl.trainer.packing import plan_micro_batches

from conftest import make_model


def test_packed_loss_and_gradients_equal_the_padded_ones():
    model = make_model(vocab=64, hidden=32).train()
    g = torch.Generator().manual_seed(0)
    examples = []
    for n in (30, 7, 12, 5, 22, 9, 3, 16):
        ids = torch.randint(1, 64, (n,), generator=g).tolist()
        examples.append((ids, max(1, n // 3)) if n % 2 else (ids, torch.randint(0, 2, (n,), generator=g).tolist()))
    batch = sft_batch(examples, pad_id=0)
    lengths = batch[1].sum(-1).tolist()
    assert any(len(row) > 1 for mb in plan_micro_batches(lengths, MICRO_BATCH_TOKENS) for row in mb)
    assert any(len(row) > 1 for mb in plan_micro_batches(lengths, 64) for row in mb)
    results = []
    for pack_rows, max_tokens in ((False, MICRO_BATCH_TOKENS), (True, MICRO_BATCH_TOKENS), (True, 64), (False, 64)):
        model.zero_grad()
        loss = sum(
            part.backward() or part.detach()
            for part in micro_batch_losses(model, *batch, pack_rows=pack_rows, max_tokens=max_tokens)
        )
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((loss, grads))
    (loss0, grads0) = results[0]
    for loss, grads in results[1:]:
        assert torch.allclose(loss, loss0, atol=1e-5, rtol=0)
        assert torch.allclose(grads, grads0, atol=1e-5, rtol=1e-4)
