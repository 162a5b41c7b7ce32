"""The trainer: a model and its optimizer. Algorithm-blind: it calls an advantage function and a policy loss
passed in by the caller, aggregates the loss as a token mean over the batch, and accumulates gradients
over micro-batches."""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from asyncrl.types import Batch


def token_logprobs(model, input_ids, attention_mask, temperature: float = 1.0, with_entropy: bool = False):
    """Log-probabilities (N, T-1) of tokens 1..T-1 given their prefixes, at ``temperature``."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = logits.log_softmax(dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy.detach()


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group row indices (longest first) so that rows x padded length stays within ``max_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


class Trainer:
    def __init__(
        self,
        model,
        *,
        adv_fn: Callable,
        loss_fn: Callable,
        loss_options: dict | None = None,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_grad_norm: float = 1.0,
        mb_max_tokens: int = 8192,
        ppo_n_minibatches: int = 1,
        temperature: float = 1.0,
        autocast_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.model.train()
        self.adv_fn, self.loss_fn, self.loss_options = adv_fn, loss_fn, dict(loss_options or {})
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.base_lr, self.warmup_steps = lr, warmup_steps
        self.max_grad_norm = max_grad_norm
        self.mb_max_tokens = mb_max_tokens
        self.n_minibatches = ppo_n_minibatches
        self.temperature = temperature
        self.autocast_dtype = autocast_dtype
        self.steps_done = 0

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.autocast_dtype)

    def _rows(self, batch: Batch, idx: list[int]):
        ids = torch.tensor(idx)
        T = int(batch.attention_mask[ids].sum(-1).max())
        return batch.input_ids[ids, :T], batch.attention_mask[ids, :T], ids, T

    @torch.no_grad()
    def logprobs(self, batch: Batch) -> torch.Tensor:
        """Log-probabilities (N, T-1) of every token under the current weights (the proximal policy)."""
        out = torch.zeros_like(batch.behav_logprobs)
        lengths = batch.attention_mask.sum(-1).tolist()
        for mb in micro_batches(lengths, self.mb_max_tokens):
            input_ids, attention_mask, ids, T = self._rows(batch, mb)
            with self._autocast():
                logp, _ = token_logprobs(self.model, input_ids, attention_mask, self.temperature)
            out[ids, : T - 1] = logp
        return out

    def step(self, batch: Batch, version: int = 0) -> dict:
        """One training step on ``batch`` with the weights of ``version``: advantages, then
        ``ppo_n_minibatches`` optimizer steps."""
        t0 = time.perf_counter()
        advantages = self.adv_fn(batch.rewards, batch.group_ids, batch.loss_mask)
        prox = self.logprobs(batch) if self.n_minibatches > 1 else None
        n_rows = batch.input_ids.shape[0]
        order = torch.randperm(n_rows).tolist() if self.n_minibatches > 1 else list(range(n_rows))
        chunks = [order[i :: self.n_minibatches] for i in range(self.n_minibatches)]
        totals: dict[str, float] = {}
        for rows in chunks:
            if rows:
                self._minibatch_step(batch, rows, advantages, prox, totals)
        self.steps_done += 1
        n_tok = float(batch.loss_mask.sum())
        stats = {k: v / max(n_tok, 1.0) for k, v in totals.items() if k not in ("grad_norm", "lr")}
        stats["grad_norm"] = totals.get("grad_norm", 0.0) / self.n_minibatches
        stats["lr"] = totals.get("lr", self.base_lr)
        stats["adv_abs_mean"] = float((advantages.abs() * batch.loss_mask).sum() / max(n_tok, 1.0))
        stats["train_time_s"] = time.perf_counter() - t0
        stats["train_tokens"] = batch.n_tokens
        return stats

    def _minibatch_step(self, batch: Batch, rows: list[int], advantages, prox, totals: dict) -> None:
        lr = self.base_lr * min(1.0, (self.steps_done + 1) / self.warmup_steps) if self.warmup_steps else self.base_lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        sub_lengths = batch.attention_mask[torch.tensor(rows)].sum(-1).tolist()
        n_tok = float(batch.loss_mask[torch.tensor(rows)].sum())
        for mb in micro_batches(sub_lengths, self.mb_max_tokens):
            input_ids, attention_mask, ids, T = self._rows(batch, [rows[i] for i in mb])
            mask = batch.loss_mask[ids, : T - 1]
            with self._autocast():
                logp, entropy = token_logprobs(self.model, input_ids, attention_mask, self.temperature, True)
            per_token, stats = self.loss_fn(
                logprobs=logp,
                prox_logprobs=logp.detach() if prox is None else prox[ids, : T - 1],
                behav_logprobs=batch.behav_logprobs[ids, : T - 1],
                advantages=advantages[ids, : T - 1],
                mask=mask,
                versions=batch.versions[ids, : T - 1],
                **self.loss_options,
            )
            loss = per_token.sum() / max(n_tok, 1.0)
            loss.backward()
            mb_tok = float(mask.sum())
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v * mb_tok
            totals["loss"] = totals.get("loss", 0.0) + loss.item() * n_tok
            totals["entropy"] = totals.get("entropy", 0.0) + float((entropy * mask).sum())
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) if params else 0.0
        totals["grad_norm"] = totals.get("grad_norm", 0.0) + float(norm)
        totals["lr"] = lr
        self.optimizer.step()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """HF-named weights for publishing (live tensors; engines copy them)."""
        return self.model.state_dict()

    def save(self, path: str, tokenizer=None) -> None:
        self.model.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)


def build_trainer(cfg, model, *, model_path: str, temperature: float, autocast_dtype: torch.dtype | None) -> Trainer:
    """The trainer for an ``ActorConfig``; ``model_path`` is where extra models (reference, critic) load from."""
    from asyncrl.algo import ADVANTAGES, POLICY_LOSSES

    return Trainer(
        model, adv_fn=ADVANTAGES[cfg.adv_estimator], loss_fn=POLICY_LOSSES[cfg.policy_loss],
        loss_options={"eps_clip": cfg.eps_clip, "eps_clip_higher": cfg.eps_clip_higher,
                      "behav_imp_weight_cap": cfg.behav_imp_weight_cap},
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm, mb_max_tokens=cfg.mb_max_tokens, ppo_n_minibatches=cfg.ppo_n_minibatches,
        temperature=temperature, autocast_dtype=autocast_dtype,
    )
