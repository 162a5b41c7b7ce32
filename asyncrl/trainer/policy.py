"""The policy trainer: a model and its optimizer. Algorithm-blind: it shapes rewards, calls an advantage function,
a policy loss and a loss aggregation from :mod:`asyncrl.algo` (picked by ``build_trainer`` from the config),
and accumulates gradients over micro-batches, packed or padded.

One step (``PolicyTrainer.step``), as in AReaL's trainer:

1. no-grad passes where the configuration needs them: the proximal log-probs (``ppo_n_minibatches > 1`` or
   ``ppo_epochs > 1``
   with ``prox_logp_method=recompute``), the reference model's log-probs (KL), the critic's values;
2. shaped rewards -> per-token rewards (minus β·KL when the KL is in the reward) -> advantages (+ returns
   for the critic);
3. ``ppo_epochs`` x ``ppo_n_minibatches`` optimizer steps, each accumulating ``Σ weight · per-token loss`` (+ β·KL in
the
   loss, + the value loss of a value head) over micro-batches; a separate critic takes its own step.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from asyncrl.algo.advantages import masked_whiten
from asyncrl.algo.aggregate import token_mean
from asyncrl.algo.algorithm import Algorithm
from asyncrl.algo.audit import add, audit_summary, audit_sums, ess
from asyncrl.algo.losses import LossInputs, clipped_value_loss
from asyncrl.algo.offpolicy import loglinear_prox_logprobs
from asyncrl.algo.shaping import place_at_last_token, shape_rewards
from asyncrl.cluster.parallel import DataParallel, all_reduce_cpu
from asyncrl.models.lora import is_lora, merged_state_dict
from asyncrl.trainer import state
from asyncrl.trainer.critic import ValueHead, critic_step
from asyncrl.trainer.forward import Forward, Outputs, evaluating
from asyncrl.trainer.packing import check_packing
from asyncrl.trainer.sharing import attention_width, sharing_problem
from asyncrl.trainer.state import update_norm
from asyncrl.types import Batch


@dataclass
class _MicroBatch:
    """Which samples a micro-batch holds and its slices of the minibatch-wide tensors."""

    ids: torch.Tensor  # (rows,) sample indices into the batch
    target_len: int  # T_mb - 1
    mask: torch.Tensor  # (rows, T_mb - 1) loss mask
    weights: torch.Tensor  # (rows, T_mb - 1) aggregation weights of the policy loss
    value_weights: torch.Tensor  # (rows, T_mb - 1) token-mean weights of the value loss


class PolicyTrainer:
    """The policy (and optionally a critic and a frozen reference model) with its optimizer; ``step`` trains
    on a ``Batch`` with the functions of an ``Algorithm``."""

    def __init__(
        self,
        model,
        algo: Algorithm | None = None,
        *,
        ref_model=None,
        critic: str = "none",
        critic_model=None,
        critic_lr: float | None = None,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_grad_norm: float = 1.0,
        mb_max_tokens: int = 8192,
        ppo_n_minibatches: int = 1,
        ppo_epochs: int = 1,
        pack_sequences: bool = False,
        shared_prefix: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        autocast_dtype: torch.dtype | None = None,
        dp: DataParallel | None = None,
        device: torch.device | str = "cpu",
        threads: Callable[[], int] | None = None,
    ):
        if dp is not None and critic != "none":
            raise ValueError(
                "several trainer ranks train the policy only: use actor.critic=none (GRPO-family "
                "advantages) or one rank"
            )
        if dp is not None and dp.fsdp and is_lora(model):
            raise ValueError("LoRA trains with DDP or one rank, not FSDP")
        self.device, self.dp = torch.device(device), dp
        self.module = model.to(self.device).train()  # the model itself (its weights, config, save_pretrained)
        with evaluating(model):  # without dropout (LoRA's), which would make the comparisons random
            if pack_sequences:
                check_packing(model)
            self.sharing_off = sharing_problem(model) if shared_prefix else None  # why it cannot share, if so
        self.model = model if dp is None else dp.wrap(model)  # what runs forward and backward
        self.algo = algo or Algorithm()
        self.ref_model = ref_model  # a frozen model, or a callable one (AdaptersOff: the policy without LoRA)
        if isinstance(ref_model, torch.nn.Module):
            ref_model.to(self.device).eval().requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]  # with LoRA: the adapters only
        self.value_head = self.critic_model = self.critic_optimizer = None
        if critic == "value_head":
            self.value_head = ValueHead(model.config.hidden_size).to(self.device)
            params += list(self.value_head.parameters())
        elif critic == "separate":
            if critic_model is None:
                raise ValueError("critic='separate' needs a critic_model")
            self.critic_model = critic_model.to(self.device).train()
            self.value_head = ValueHead(critic_model.config.hidden_size).to(self.device)
            self.critic_optimizer = torch.optim.AdamW(
                list(critic_model.parameters()) + list(self.value_head.parameters()),
                lr=critic_lr or lr,
                betas=betas,
                weight_decay=weight_decay,
            )
        elif critic != "none":
            raise ValueError(f"critic must be none, value_head or separate, got '{critic}'")
        self.optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.base_lr, self.critic_lr, self.warmup_steps = lr, critic_lr or lr, warmup_steps
        self.max_grad_norm = max_grad_norm
        self.n_minibatches, self.ppo_epochs = ppo_n_minibatches, ppo_epochs
        # micro-batches, their layout, and the log-probs at the engine's sampling distribution
        self.forward = Forward(
            self.device,
            mb_max_tokens,
            pack_sequences,
            temperature,
            top_p,
            top_k,
            autocast_dtype,
            dp,
            threads,
            shared_prefix=shared_prefix and self.sharing_off is None,
            attention_width=attention_width(model),
        )
        self.steps_done = 0
        self.skipped_updates = 0  # non-finite updates skipped in the current step
        self.optim_s = 0.0  # time in the optimizer during the current step
        self._mismatch = [0.0, 0]  # |behaviour - proximal log-prob| summed over tokens of the current version
        self._full: dict[str, torch.Tensor] | None = None  # gathered weights of the last step (FSDP)

    @property
    def shared_value_head(self) -> bool:
        return self.value_head is not None and self.critic_model is None

    # ---- no-grad passes ----------------------------------------------------------------------------------
    def logprobs(self, batch: Batch, model=None) -> torch.Tensor:
        """Log-probabilities (N, T-1) of every token under ``model`` (default: the policy's current weights,
        i.e. the proximal policy at the start of a step)."""
        model = self.model if model is None else model
        return self.forward.gather(
            batch, lambda ids, rows: self.forward.run(model, batch, ids, rows).logprobs, *self._modules
        )

    def values(self, batch: Batch) -> torch.Tensor:
        """The critic's values (N, T-1): position t values the state before target token t."""
        trunk = self.critic_model if self.critic_model is not None else self.model
        return self.forward.gather(
            batch,
            lambda ids, rows: self.value_head(
                self.forward.run(trunk, batch, ids, rows, logprobs=trunk is self.model, hidden=True).hidden
            ),
            *self._modules,
        )

    @property
    def _modules(self) -> tuple:
        """The policy (which runs the empty passes), then the critic and value head: in eval mode for no-grad
        passes."""
        return self.model, self.critic_model, self.value_head

    # ---- the step ----------------------------------------------------------------------------------------
    def step(self, batch: Batch, version: int = 0) -> dict:
        """One training step on ``batch`` with the weights of ``version``: advantages, then
        ``ppo_n_minibatches`` optimizer steps. Returns float statistics. An update whose loss or gradient is
        not finite is skipped and ends the step (``nonfinite_skipped`` = 1; the updates of earlier minibatches
        of the step stay applied, and a separate critic skips its update of that minibatch too)."""
        t0 = time.perf_counter()
        algo, self.skipped_updates, self.optim_s, self._mismatch = self.algo, 0, 0.0, [0.0, 0]
        self._audit: dict[str, float] = {}  # the correction audit's sums over the first pass (asyncrl.algo.audit)
        self._update_norms: list[float] = []  # the size of each optimizer step's update
        need_prox = self.n_minibatches * self.ppo_epochs > 1 and algo.prox_method == "recompute"
        prox = self.logprobs(batch) if need_prox else None
        ref = self.logprobs(batch, self.ref_model) if self.ref_model is not None else None
        values = self.values(batch) if self.value_head is not None else None
        recompute_s = time.perf_counter() - t0
        advantages, returns, stats = self._advantages(batch, ref, values)

        chunks = self._minibatches(batch) * self.ppo_epochs  # every epoch passes over the same minibatches
        totals: dict[str, float] = {}
        lr, done, minibatches_s = self._lr(self.base_lr), 0, 0.0
        for index, rows in enumerate(chunks):
            if rows or self.dp:  # every rank takes every minibatch's collective steps
                t1 = time.perf_counter()
                self._minibatch_step(batch, rows, index, version, advantages, returns, values, prox, ref, totals)
                minibatches_s += time.perf_counter() - t1
                done += 1
            if self.skipped_updates:  # the rest of the step would start from the same bad batch: stop here
                break
        self.steps_done += 1
        tok = max(totals.pop("_tokens", 0.0), 1.0)
        for key in [k for k in totals if k.startswith("_per_mb_")]:
            stats[key[len("_per_mb_") :]] = totals.pop(key) / max(done, 1)
        for key in [k for k in totals if k.endswith("_max")]:
            stats[key] = totals.pop(key)
        slots, real = totals.pop("_slots", 0.0), totals.pop("_real", 0.0)
        positions = totals.pop("_positions", 0.0)
        stats.update({k: v / tok for k, v in totals.items()})
        stats["lr"] = lr
        mask = batch.loss_mask
        n_tok = float(mask.sum())
        stats["adv_abs_mean"] = float((advantages.abs() * mask).sum() / max(n_tok, 1.0))
        stats["pack_efficiency"] = positions / slots if slots else 0.0  # positions holding a token / computed
        stats["train_positions"] = slots  # positions the policy's forward passes computed, padding included
        stats["prefix_shared_frac"] = 1.0 - positions / real if real else 0.0  # tokens not recomputed: shared
        stats["train_time_s"] = time.perf_counter() - t0
        stats["train_recompute_s"] = recompute_s  # the no-grad passes: proximal and reference log-probs, values
        stats["train_fwd_bwd_s"] = minibatches_s - self.optim_s
        stats["train_optim_s"] = self.optim_s  # clipping and the optimizer steps
        if self._mismatch[1]:  # |behaviour - recomputed log-prob| where they should agree (~1e-6 in float32)
            stats["mismatch_abs_mean"] = self._mismatch[0] / self._mismatch[1]
        stats["train_tokens"] = batch.n_tokens
        stats["nonfinite_skipped"] = self.skipped_updates
        stats.update(audit_summary(self._audit))
        if self._update_norms:
            stats["update_norm"] = sum(self._update_norms) / len(self._update_norms)
        return stats

    def _minibatches(self, batch: Batch) -> list[list[int]]:
        """Row indices of each of the step's ``ppo_n_minibatches`` minibatches: whole groups, dealt in a random
        order drawn from the step number, so every trainer rank (holding some of the groups) makes the same
        split as one process holding them all."""
        n_rows = batch.input_ids.shape[0]
        if self.n_minibatches == 1:
            return [list(range(n_rows))]
        n_groups = int(batch.group_ids.max()) + 1
        if self.dp is not None:
            n_groups = self.dp.max(n_groups)
        order = torch.randperm(n_groups, generator=torch.Generator().manual_seed(self.steps_done))
        slot = torch.empty(n_groups, dtype=torch.long)
        slot[order] = torch.arange(n_groups) % self.n_minibatches
        which = slot[batch.group_ids]
        return [(which == k).nonzero().flatten().tolist() for k in range(self.n_minibatches)]

    def _advantages(self, batch: Batch, ref: torch.Tensor | None, values: torch.Tensor | None):
        """Shaped rewards -> (advantages (N, T-1), returns (N, T-1) or None, stats)."""
        algo, mask = self.algo, batch.loss_mask
        shaped, stats = shape_rewards(batch.rewards, mask.sum(-1), batch.truncated, algo.shaping)
        token_rewards, scores = place_at_last_token(shaped, mask), shaped
        if ref is not None:
            kl = algo.kl_fn(batch.behav_logprobs, ref) * mask  # the sampling policy against the reference
            stats["ref_kl"] = float(kl.sum() / mask.sum().clamp(min=1))
            if algo.kl_ctl > 0 and not algo.kl_in_loss:
                token_rewards = token_rewards - algo.kl_ctl * kl
                scores = scores - algo.kl_ctl * kl.sum(-1)
        advantages = algo.adv_fn(
            scores, batch.group_ids, mask, token_rewards=token_rewards, values=values, gamma=algo.gamma, lam=algo.lam
        )
        returns = None if values is None else (advantages + values) * mask
        if algo.adv_norm:
            advantages = masked_whiten(advantages, mask)
        return advantages, returns, stats

    def _lr(self, base: float) -> float:
        if not self.warmup_steps:
            return base
        return base * min(1.0, (self.steps_done + 1) / self.warmup_steps)

    def _minibatch_step(
        self,
        batch: Batch,
        rows: list[int],
        index: int,
        version: int,
        advantages,
        returns,
        values,
        prox,
        ref,
        totals: dict,
    ) -> None:
        """One optimizer step on the samples ``rows`` (the ``index``-th minibatch of the step)."""
        lr = self._lr(self.base_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        self._weights_seen: dict[str, float] = {}  # the minibatch's behaviour weights (ESS-scaled steps)
        rows_t = torch.tensor(rows, dtype=torch.long)  # may be empty: this rank holds none of the minibatch
        weights = self.algo.agg_fn(batch.loss_mask[rows_t], **self.algo.agg_options)  # sums to the aggregate
        value_weights = token_mean(batch.loss_mask[rows_t])
        plan = self.forward.micro_batches(batch, rows)
        mb_loss = 0.0
        for k, item in enumerate(plan):
            with self._accumulating(last=k == len(plan) - 1):
                if item is None:
                    self.forward.empty_loss(self.model).backward()
                    continue
                mb_loss += self._micro_batch_step(
                    batch, item, index, version, weights, value_weights, advantages, returns, values, prox, ref, totals
                )
        self._finish_minibatch(batch, plan, values, returns, value_weights, totals, mb_loss)

    def _accumulating(self, last: bool):
        return contextlib.nullcontext() if self.dp is None else self.dp.accumulate(self.model, last)

    def _micro_batch_step(
        self, batch, item, index, version, weights, value_weights, advantages, returns, values, prox, ref, totals
    ) -> float:
        """Forward and backward of one micro-batch, its statistics added to ``totals``; returns its loss."""
        mb, ids, packed_rows = item
        self.forward.set_threads()
        out = self.forward.run(self.model, batch, ids, packed_rows, entropy=True, hidden=self.shared_value_head)
        L, d = out.target_len, self.forward.dev
        inputs = _MicroBatch(ids, L, d(batch.loss_mask[ids, :L]), d(weights[mb, :L]), d(value_weights[mb, :L]))
        loss, stats = self._micro_batch_loss(batch, inputs, out, index, version, advantages, returns, values, prox, ref)
        (loss * self._loss_scale).backward()
        mb_tok = float(inputs.mask.sum())
        if "value_loss" in stats:  # already this micro-batch's share of the minibatch's value loss
            totals["_per_mb_value_loss"] = totals.get("_per_mb_value_loss", 0.0) + stats.pop("value_loss")
        for k, v in stats.items():
            totals[k] = max(totals.get(k, v), v) if k.endswith("_max") else totals.get(k, 0.0) + v * mb_tok
        totals["entropy"] = totals.get("entropy", 0.0) + float((out.entropy * inputs.mask).sum())
        totals["_tokens"] = totals.get("_tokens", 0.0) + mb_tok
        totals["_slots"] = totals.get("_slots", 0.0) + out.slots
        totals["_positions"] = totals.get("_positions", 0.0) + out.positions
        totals["_real"] = totals.get("_real", 0.0) + float(batch.attention_mask[ids].sum())
        return float(loss.detach())

    @property
    def _loss_scale(self) -> float:
        return 1.0 if self.dp is None else self.dp.loss_scale

    def _finish_minibatch(self, batch, plan, values, returns, value_weights, totals, mb_loss: float) -> None:
        """Clip and apply the minibatch's gradients (then the separate critic's step); with ``ess_lr`` at a
        learning rate scaled by the ESS of the minibatch's behaviour weights (every rank's together)."""
        totals["_per_mb_loss"] = totals.get("_per_mb_loss", 0.0) + mb_loss
        if self.algo.ess_lr:
            seen = torch.tensor([self._weights_seen.get(k, 0.0) for k in ("w", "w2", "n")], dtype=torch.float64)
            if self.dp is not None:
                all_reduce_cpu(seen)
            scale = ess(*seen.tolist())
            for group in self.optimizer.param_groups:
                group["lr"] *= scale
            totals["_per_mb_lr_ess_scale"] = totals.get("_per_mb_lr_ess_scale", 0.0) + scale
        totals["_per_mb_grad_norm"] = totals.get("_per_mb_grad_norm", 0.0) + self._clip_and_step(
            self.optimizer,
            [p for g in self.optimizer.param_groups for p in g["params"]],
            loss_finite=math.isfinite(mb_loss),
        )
        if self.critic_model is not None and not self.skipped_updates:
            critic_step(self, batch, [p for p in plan if p is not None], values, returns, value_weights, totals)

    def _micro_batch_loss(
        self,
        batch: Batch,
        mb: "_MicroBatch",
        out: Outputs,
        index: int,
        version: int,
        advantages,
        returns,
        values,
        prox,
        ref,
    ) -> tuple[torch.Tensor, dict]:
        """The micro-batch's share of the minibatch loss: Σ w·L (+ β·KL in the loss, + the value head's loss)."""
        algo, ids, L, mask, d = self.algo, mb.ids, mb.target_len, mb.mask, self.forward.dev
        logp, behav, versions = out.logprobs, d(batch.behav_logprobs[ids, :L]), d(batch.versions[ids, :L])
        if prox is not None:
            prox_mb = d(prox[ids, :L])
        elif algo.prox_method == "loglinear":  # AReaL's: one version behind the policy trained, every minibatch
            prox_mb = loglinear_prox_logprobs(behav, logp, versions, version)
        elif algo.prox_method == "loglinear_ahead" and index > 0:
            prox_mb = loglinear_prox_logprobs(behav, logp, versions, version, ahead=True)
        else:
            prox_mb = logp.detach()  # the first minibatch trains the very weights that are the proximal policy
        start = prox_mb if prox is not None else logp.detach()  # the policy at the step's start (first minibatch)
        if index == 0:  # tokens of the version being trained: behaviour and proximal policy are the same weights
            current = (versions == version) & mask.bool()
            self._mismatch[0] += float((behav - start).abs()[current].sum())
            self._mismatch[1] += int(current.sum())
        adv, staleness = d(advantages[ids, :L]), version - versions
        if index < self.n_minibatches or algo.ess_lr:
            used = audit_sums(prox_mb, behav, adv, mask, staleness)  # the behaviour weights as the loss uses them
            self._weights_seen = add(self._weights_seen, used)
            if index < self.n_minibatches:  # the first pass over the batch: the correction audit, from its start
                self._audit = add(
                    self._audit, used if start is prox_mb else audit_sums(start, behav, adv, mask, staleness)
                )
        per_token, stats = algo.loss_fn(LossInputs(logp, prox_mb, behav, adv, mask), **algo.loss_options)
        loss = (per_token * mb.weights).sum()
        if ref is not None and algo.kl_in_loss and algo.kl_ctl > 0:
            kl = algo.kl_fn(logp, d(ref[ids, :L])) * mask
            loss = loss + algo.kl_ctl * (kl * mb.weights).sum()
            stats["kl_loss"] = float(kl.detach().sum() / mask.sum().clamp(min=1))
        if self.shared_value_head:
            vloss, vstats = clipped_value_loss(
                self.value_head(out.hidden),
                d(values[ids, :L]),
                d(returns[ids, :L]),
                mask,
                value_eps_clip=algo.value_eps_clip,
            )
            vloss = (vloss * mb.value_weights).sum()
            loss = loss + algo.value_loss_coef * vloss
            stats.update(vstats, value_loss=float(vloss.detach()))
        return loss, stats

    def _clip_and_step(self, optimizer, params, loss_finite: bool = True) -> float:
        """Clip and apply the gradients; an update whose loss or gradient norm is not finite is skipped
        (counted in ``nonfinite_skipped``), so NaN never reaches the weights or the optimizer state."""
        t0 = time.perf_counter()
        try:
            return self._clip_and_apply(optimizer, params, loss_finite)
        finally:
            self.optim_s += time.perf_counter() - t0

    def _clip_and_apply(self, optimizer, params, loss_finite: bool) -> float:
        params = [p for p in params if p.grad is not None]
        if not params and self.dp is None:
            return 0.0
        if self.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
        finite = loss_finite and math.isfinite(norm)
        if self.dp is not None:
            finite = self.dp.all(finite)  # every rank skips together, so the replicas stay equal
        if finite:
            optimizer.step()
            size = update_norm(optimizer, self.dp) if optimizer is self.optimizer else None
            if size is not None:
                self._update_norms.append(size)
        else:
            optimizer.zero_grad(set_to_none=True)
            self.skipped_updates += 1
        return norm

    # ---- weights -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """HF-named weights of the policy for publishing (live tensors; engines copy them); with LoRA the base
        weights with the adapters merged (new tensors where adapted). Sharded (FSDP): the full weights gathered
        after the last step (``gather_weights``), on rank 0."""
        if self.dp is not None and self.dp.fsdp:
            if self._full is None:
                raise RuntimeError("FSDP weights are gathered by gather_weights() after each step")
            return self._full
        return merged_state_dict(self.module)

    def gather_weights(self) -> None:
        """FSDP: every rank calls this after a step; rank 0 then holds the full weights (one CPU copy)."""
        if self.dp is not None and self.dp.fsdp:
            self._full = self.dp.full_state_dict(self.model)

    def training_state(self, directory: str | None = None) -> dict:
        """What an exact resume needs beyond the weights (``asyncrl.trainer.state.training_state``)."""
        return state.training_state(self, directory)

    def load_training_state(self, saved: dict, directory: str | None = None) -> None:
        """Restore ``training_state()`` saved in ``directory``."""
        state.load_training_state(self, saved, directory)

    def save(self, path: str, tokenizer=None) -> None:
        """The policy in HF format at ``path`` (``asyncrl.trainer.state.save``); non-finite weights refused."""
        state.save(self, path, tokenizer)

    def snapshot(self) -> state.WeightsCopy | None:
        """A copy of the weights now, to write later (``asyncrl.trainer.state.snapshot``)."""
        return state.snapshot(self)

    def check_finite(self) -> None:
        """Raise ``NonFiniteWeights`` naming the first weight (policy, value head, critic) that holds NaN or inf."""
        state.check_finite(self)
