"""A trainer's state (asyncrl.trainer.state): the size of the update an AdamW step just applied, read from its
state, equals the weights' change."""

import torch

from asyncrl.trainer.state import update_norm


def test_the_update_norm_is_the_weights_change():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    for decay in (0.0, 0.1):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=decay)
        for _ in range(3):
            before = [p.detach().clone() for p in model.parameters()]
            model(torch.randn(5, 4)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
            assert abs(update_norm(optimizer) - float(moved)) < 1e-3 * float(moved)
