"""Off-policy correction for stale samples: the behaviour importance weight with its rejection or
truncation, and the log-linear approximation of the proximal log-probs.

The decoupled objective (AReaL, arXiv 2505.24298, Eq. 5) multiplies each token's surrogate by

    w_t = π_prox(y_t) / π_behav(y_t),

the correction from the policy that generated the token (possibly several versions old) to the proximal
policy that anchors the clip. ``behaviour_weight`` bounds it, the way AReaL's ``rejection_sampling`` does:

- ``metric``: what is bounded: the ratio w itself, or a per-token KL estimate ``kl_k1|kl_k2|kl_k3`` of
  π_prox against π_behav;
- ``level``: ``token`` bounds every token; ``sequence`` aggregates the metric over a sample's completion
  tokens with ``agg`` (``mean|sum|max``) and bounds the sample. For the ratio the aggregation is done on
  log w, so the ``mean`` of a sequence is the geometric mean of its ratios, which also becomes the weight
  of every token of that sequence (as in GSPO);
- ``mode``: ``clamp`` truncates w into [lower, upper] where the metric is out of bounds (the tokens still
  train; truncated importance sampling, Espeholt et al. 2018); ``mask`` drops the out-of-bounds tokens or
  sequences from the loss (rejection sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.algo.kl import KL_ESTIMATORS

LOG_RATIO_LIMIT = 20.0  # log-ratios are clamped so that a -inf log-prob can never produce inf/NaN
METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3")
LEVELS = ("token", "sequence")
MODES = ("clamp", "mask")
AGGS = ("mean", "sum", "max")


def safe_log_ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a - b with NaN (from -inf - -inf) set to 0 and the result clamped to ±``LOG_RATIO_LIMIT``."""
    return torch.nan_to_num(a - b, nan=0.0).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's masked mean, broadcast over the row (N, T); 0 for rows with no masked element."""
    m = mask.to(x.dtype)
    return ((x * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)).expand_as(x)


@dataclass(frozen=True)
class BehaviourCorrection:
    """Bounds on the behaviour importance weight (built from the ``actor.behav_imp_weight_*`` keys)."""

    upper: float | None = 5.0
    lower: float | None = None
    mode: str = "clamp"
    level: str = "token"
    metric: str = "ratio"
    agg: str = "mean"

    def __post_init__(self):
        for name, value, allowed in (
            ("mode", self.mode, MODES),
            ("level", self.level, LEVELS),
            ("metric", self.metric, METRICS),
            ("agg", self.agg, AGGS),
        ):
            if value not in allowed:
                raise ValueError(f"behaviour weight {name} '{value}' is not one of {list(allowed)}")
        if self.metric != "ratio" and self.mode == "clamp":
            raise ValueError("a KL metric can only mask (mode='mask'): there is no weight to clamp it to")
        if self.level == "sequence" and self.agg != "mean" and self.mode == "clamp":
            raise ValueError(
                f"a sequence's weight is the geometric mean of its ratios, which agg='{self.agg}' does "
                "not bound: clamping it would change nothing; use mode='mask' (or agg='mean')"
            )
        if self.upper is not None and self.lower is not None and self.lower > self.upper:
            raise ValueError(f"behaviour weight lower bound {self.lower} exceeds the upper bound {self.upper}")


def behaviour_weight(
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    mask: torch.Tensor,
    correction: BehaviourCorrection = BehaviourCorrection(),
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The bounded behaviour weight (N, T), the kept-token mask (N, T) and statistics; no gradient.

    Tokens outside ``mask`` get weight 0 and are never counted."""
    c = correction
    m = mask.bool()
    log_w = safe_log_ratio(prox_logprobs.detach().float(), behav_logprobs.detach().float())
    weight = log_w.exp()
    if c.metric == "ratio":
        metric_tok = log_w  # compared in log space
    else:
        # KL(π_behav || π_prox), estimated on tokens sampled from π_behav: the sampling policy comes first
        # (k3 = w - 1 - log w, large where the weight w is; the other order kept w = 148 and dropped w = 0.007)
        metric_tok = KL_ESTIMATORS[c.metric[3:]](behav_logprobs.detach(), prox_logprobs.detach())
    if c.level == "sequence":
        if c.metric == "ratio":
            weight = sequence_mean(log_w, m).exp()  # geometric mean of the ratios
        if c.agg == "mean":
            metric_seq = sequence_mean(metric_tok, m)
        elif c.agg == "sum":
            metric_seq = (metric_tok * m).sum(-1, keepdim=True).expand_as(metric_tok)
        else:
            lowest = torch.finfo(metric_tok.dtype).min
            metric_seq = metric_tok.masked_fill(~m, lowest).max(-1, keepdim=True).values.expand_as(metric_tok)
            metric_seq = torch.where(m.any(-1, keepdim=True), metric_seq, torch.zeros_like(metric_seq))
        metric = metric_seq
    else:
        metric = metric_tok
    if c.metric == "ratio":
        metric = metric.exp()
    inside = torch.ones_like(m)
    if c.upper is not None:
        inside &= metric <= c.upper
    if c.lower is not None:
        inside &= metric >= c.lower
    outside = ~inside & m
    if c.mode == "clamp":
        clamped = weight.clamp(
            min=0.0 if c.lower is None else c.lower, max=float("inf") if c.upper is None else c.upper
        )
        weight = torch.where(outside, clamped, weight)
        keep = m
    else:
        keep = m & inside
    weight = weight * keep
    n = m.sum()
    stats = {
        "behav_weight_mean": float(weight.sum() / keep.sum()) if keep.any() else 0.0,
        "behav_weight_max": float(weight.max()) if keep.any() else 0.0,
        "behav_weight_capped_frac": float(outside.sum() / n) if n > 0 else 0.0,
        "behav_kl": float((-log_w * m).sum() / n) if n > 0 else 0.0,  # k1 estimate of KL(π_behav || π_prox)
    }
    return weight, keep.to(mask.dtype), stats


def loglinear_prox_logprobs(
    behav_logprobs: torch.Tensor, logprobs: torch.Tensor, versions: torch.Tensor, version: int, ahead: bool = False
) -> torch.Tensor:
    """Log-linear approximation of the proximal log-probs from per-token versions, which skips the recompute pass:

        log π_prox ≈ log π_behav + α (log π_θ - log π_behav),   α = clamp((v_prox - v_b) / (v_θ - v_b), 0, 1)

    with v_b the version that generated the token and v_θ = ``version``, the weights being trained.

    - AReaL's (``prox_logp_method=loglinear``, A-3PO, arXiv 2512.06547): v_prox = version - 1, one step behind
      the policy being trained, so a token s ≥ 1 versions old gets α = (s - 1)/s and u = π_θ/π_prox =
      (π_θ/π_behav)^(1/s): the decoupled clip binds on stale tokens even at one optimizer step per batch (at s = 1
      it is naive PPO's clip); a fresh token (s = 0) gets π_prox = π_behav.
    - ``ahead`` (``prox_logp_method=loglinear_ahead``): v_prox = version and v_θ = version + 1 (what the weights
      become after this step): a token s versions old gets α = s/(s + 1). At the first optimizer step of a batch
      π_θ is the policy being trained, so this acts from the second minibatch on only (the trainer applies it
      there).

    Positions with version -1 (prompt, padding) keep the behaviour log-prob. No gradient flows through the result.
    """
    vb = versions.double()
    v_prox, v_theta = (version, version + 1) if ahead else (version - 1, version)
    span = v_theta - vb
    alpha = torch.where((vb >= 0) & (span > 0), (v_prox - vb) / span.clamp(min=1), torch.zeros_like(vb))
    alpha = alpha.clamp(0.0, 1.0).float()
    lb, lt = behav_logprobs.detach().float(), logprobs.detach().float()
    approx = lb + alpha * safe_log_ratio(lt, lb)
    return torch.where(torch.isfinite(approx), approx, lb)
