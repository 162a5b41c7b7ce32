"""How the trainer runs a batch through a model: the batch cut into micro-batches of at most ``mb_max_tokens``
positions, each laid out padded (one sample a row), packed (several samples a row, each attending to itself
only: :mod:`asyncrl.trainer.packing`) or shared (samples with a common prefix as a prefix tree, each shared
position computed once: :mod:`asyncrl.trainer.sharing`), on the training device under autocast; outputs come
back in the padded layout (rows, T_mb - 1) whatever the layout was: the log-probs of the targets at the engine's
sampling distribution (temperature, top-k, top-p: :mod:`asyncrl.trainer.logprobs`), their entropy, the last hidden
states.

Several trainer ranks make the same collective calls whatever their share of the batch: a rank with fewer
micro-batches than another runs empty passes (``None`` in :meth:`Forward.micro_batches`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from asyncrl.cluster.cores import use_threads
from asyncrl.cluster.parallel import DataParallel
from asyncrl.trainer.logprobs import logprobs_from_logits
from asyncrl.trainer.packing import micro_batches, pack, packed_forward, plan_micro_batches, unpack
from asyncrl.trainer.sharing import ROW_TOKENS, lay_out, plan_shared, shared_forward, to_padded
from asyncrl.types import Batch


@dataclass
class Outputs:
    """Per-target outputs of one micro-batch in the padded layout (rows, T_mb - 1)."""

    logprobs: torch.Tensor | None
    entropy: torch.Tensor | None
    hidden: torch.Tensor | None
    target_len: int
    slots: int  # token positions the forward pass computed (padding included)
    positions: int = 0  # of which hold a token (a shared prefix counted once)


MicroBatch = tuple[list[int], torch.Tensor, list[list[int]]]
"""(positions in the minibatch's rows, global sample ids, packed rows as indices into those ids)."""


@contextlib.contextmanager
def evaluating(*modules):
    """``modules`` (None skipped) in eval mode for the block, then back in the mode each was in."""
    modes = [(m, m.training) for m in modules if m is not None]
    for m, _ in modes:
        m.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.train(training)


def _last_hidden(out) -> torch.Tensor:
    hidden = getattr(out, "last_hidden_state", None)  # a trunk (AutoModel) has it; a causal LM has hidden_states
    return hidden if hidden is not None else out.hidden_states[-1]


@dataclass
class Forward:
    """The trainer's forward passes, as plain settings: ``device``, micro-batches of at most ``mb_max_tokens``
    positions, ``pack_sequences``, the sampling distribution the log-probs are taken at, ``autocast_dtype``, the
    ranks (``dp``), ``threads`` (torch threads for the next micro-batch, asked before each), ``shared_prefix``
    (rows of prefix trees of at most ``row_tokens`` positions, cut where a wider row's attention would cost more
    than it saves: ``attention_width``, ``sharing.attention_width``)."""

    device: torch.device
    mb_max_tokens: int = 8192
    pack_sequences: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    autocast_dtype: torch.dtype | None = None
    dp: DataParallel | None = None
    threads: Callable[[], int] | None = None
    shared_prefix: bool = False
    row_tokens: int = ROW_TOKENS
    attention_width: float | None = None  # the row width at which attention costs what the rest of a layer does

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def dev(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """``x`` on the training device (the batch and the algorithm's tensors live on the CPU; a no-op there)."""
        return None if x is None else x.to(self.device)

    def set_threads(self) -> None:
        """With a share of the cores (``threads``), as many torch threads as it gives this thread now."""
        if self.threads is not None:
            use_threads(self.threads())

    def empty_loss(self, model) -> torch.Tensor:
        """A forward pass that contributes nothing: a rank with fewer micro-batches than another runs these,
        so that every rank makes the same collective calls (FSDP gathers weights in every forward)."""
        with self.autocast():
            logits = model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=self.device), use_cache=False).logits
        return logits.float().sum() * 0.0

    def plan(self, lengths: list[int], seqs: list[list[int]] | None = None) -> list[list[list[int]]]:
        """Micro-batches as lists of rows of indices into ``lengths`` (padded: one sample per row; shared: rows of
        prefix trees of the token sequences ``seqs``)."""
        if self.shared_prefix and seqs is not None:
            return plan_shared(seqs, self.mb_max_tokens, self.row_tokens, self.attention_width)
        if self.pack_sequences:
            return plan_micro_batches(lengths, self.mb_max_tokens)
        return [[[i] for i in mb] for mb in micro_batches(lengths, self.mb_max_tokens)]

    def micro_batches(self, batch: Batch, rows: list[int]) -> list[MicroBatch | None]:
        """Each micro-batch of the samples ``rows`` (:data:`MicroBatch`), then ``None`` for the empty passes that
        bring this rank to the most micro-batches of any rank."""
        lengths = batch.attention_mask[torch.tensor(rows, dtype=torch.long)].sum(-1).tolist()
        seqs = [batch.input_ids[r, :n].tolist() for r, n in zip(rows, lengths)] if self.shared_prefix else None
        plan = []
        for mb in self.plan(lengths, seqs) if rows else []:
            flat = [i for row in mb for i in row]
            local, start = [], 0
            for row in mb:
                local.append(list(range(start, start + len(row))))
                start += len(row)
            plan.append((flat, torch.tensor([rows[i] for i in flat]), local))
        return plan + [None] * ((self.dp.max(len(plan)) if self.dp else len(plan)) - len(plan))

    def run(
        self,
        model,
        batch: Batch,
        ids: torch.Tensor,
        rows: list[list[int]] | None = None,
        *,
        logprobs: bool = True,
        entropy: bool = False,
        hidden: bool = False,
    ) -> Outputs:
        """One micro-batch (samples ``ids`` of ``batch``, in ``rows`` of indices into ``ids`` when packing or
        sharing) through ``model``, outputs in the padded layout (len(ids), T_mb - 1). A micro-batch whose rows
        hold one sample each runs padded: the same layout, with a cheaper attention mask; one whose samples share
        no prefix runs packed when packing is on."""
        lengths = batch.attention_mask[ids].sum(-1).tolist()
        T = max(lengths)
        input_ids = self.dev(batch.input_ids[ids, :T])
        kwargs = {"output_hidden_states": True} if hidden and logprobs else {}
        several = rows is not None and any(len(row) > 1 for row in rows)
        shared = None
        if self.shared_prefix and several:  # laid out from the batch's CPU copy: no copy back from the device
            shared = lay_out(batch.input_ids[ids, :T], lengths, rows, device=self.device)
        if shared is not None and shared.positions == sum(lengths) and self.pack_sequences:
            shared = None  # nothing in common: packing computes the same positions with the model's own mask
        with self.autocast():
            if shared is not None:
                out = shared_forward(model, shared, **kwargs)
                targets, slots, positions = shared.targets, shared.n_slots, shared.positions

                def pick(x):  # (R, W, ...) -> (K, ...): the input position of each target
                    return x[shared.src]

                def back(x):  # (K, ...) -> (rows, T-1, ...)
                    return to_padded(x, shared)
            elif self.pack_sequences and several:
                packed = pack(input_ids, lengths, rows)
                out = packed_forward(model, packed, **kwargs)
                targets, slots, positions = packed.input_ids[:, 1:], packed.n_slots, sum(lengths)

                def pick(x):
                    return x[:, :-1]

                def back(x):  # (R, W-1, ...) packed targets -> (rows, T-1, ...)
                    return unpack(x, packed)
            else:
                out = model(
                    input_ids=input_ids,
                    attention_mask=self.dev(batch.attention_mask[ids, :T]),
                    use_cache=False,
                    **kwargs,
                )
                targets, slots, positions = input_ids[:, 1:], input_ids.numel(), sum(lengths)
                valid = self.dev(batch.attention_mask[ids, 1:T]).bool()  # targets that exist (not padding)

                def pick(x):
                    return x[:, :-1]

                def back(x):  # zero beyond each sample, as the packed layout leaves it
                    v = valid.reshape(valid.shape + (1,) * (x.dim() - 2))
                    return torch.where(v, x, torch.zeros((), dtype=x.dtype))

            logp = ent = h = None
            if logprobs:
                logp, ent = logprobs_from_logits(
                    pick(out.logits), targets, self.temperature, entropy, self.top_p, self.top_k
                )
                logp = back(logp)
                ent = None if ent is None else back(ent)
            if hidden:
                h = back(pick(_last_hidden(out)))
        return Outputs(logp, ent, h, T - 1, slots, positions)

    @torch.no_grad()
    def gather(
        self, batch: Batch, fn: Callable[[torch.Tensor, list[list[int]]], torch.Tensor], model, *others
    ) -> torch.Tensor:
        """``fn(ids, rows) -> (len(ids), T_mb - 1)`` over every micro-batch of ``batch``, as (N, T-1), with
        ``model`` (and ``others``) in eval mode: without (LoRA) dropout, as the engine sampled, so that the
        proximal log-probs are the weights' own."""
        out = torch.zeros_like(batch.behav_logprobs)
        with evaluating(model, *others):
            for item in self.micro_batches(batch, list(range(batch.input_ids.shape[0]))):
                if item is None:
                    self.empty_loss(model)
                    continue
                _, ids, rows = item
                self.set_threads()
                o = fn(ids, rows)
                out[ids, : o.shape[1]] = o.to(out.device)
        return out
