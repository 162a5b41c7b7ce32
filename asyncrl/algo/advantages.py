"""Advantage estimators: pure functions registered by name in ``ADVANTAGES``.

Every estimator takes the same arguments and returns advantages (N, T), zero outside ``loss_mask``:

    fn(rewards (N,), group_ids (N,), loss_mask (N, T), *, token_rewards (N, T), values (N, T) | None,
       gamma, lam, eps) -> (N, T)

``rewards`` are the shaped sequence rewards (minus the summed KL penalty when the KL is in the reward);
``token_rewards`` the same credit per token (the reward on the last completion token, -β·KL on every one).
Sequence-level estimators broadcast one value over a row's completion tokens. A group of one sample gets
advantage 0 from every group-baseline estimator (there is nothing to compare it with). Statistics are
computed in float64; batch statistics are summed over data-parallel ranks when torch.distributed is up.
"""

from __future__ import annotations

import torch

from asyncrl.cluster.parallel import all_reduce_cpu

_all_reduce = all_reduce_cpu


def group_stats(x: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (mean, unbiased std, size) of the row's group; std is 0 for groups of one."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    x64 = x.double()
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, x64)
    mean = sums / counts
    dev = (x64 - mean[inv]) ** 2
    var = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, dev) / (counts - 1).clamp(min=1)
    return mean[inv], var.sqrt()[inv], counts[inv]


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / (std + eps) over the masked elements of the whole batch (all ranks), unbiased std; zero
    outside the mask. With one masked element the std is taken as 0."""
    m = mask.double()
    stats = torch.stack([(x.double() * m).sum(), (x.double() ** 2 * m).sum(), m.sum()])
    _all_reduce(stats)
    s, sq, n = stats.tolist()
    if n == 0:
        return torch.zeros_like(x, dtype=torch.float32)
    mean = s / n
    var = max(sq / n - mean**2, 0.0) * (n / (n - 1) if n > 1 else 0.0)
    centred = x.double() - mean if shift_mean else x.double()
    return (centred / (var**0.5 + eps) * m).to(torch.float32)


def _broadcast(adv: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return (adv.to(torch.float32)[:, None] * loss_mask).to(torch.float32)


def grpo(rewards, group_ids, loss_mask, *, eps: float = 1e-6, **_):
    """GRPO: A_i = (r_i - mean(r_group)) / (std(r_group) + eps), unbiased std (Shao et al. 2024,
    DeepSeekMath, arXiv 2402.03300, §4.1.2)."""
    mean, std, _ = group_stats(rewards, group_ids)
    return _broadcast((rewards.double() - mean) / (std + eps), loss_mask)


def dr_grpo(rewards, group_ids, loss_mask, **_):
    """Dr.GRPO: A_i = r_i - mean(r_group), no division by the std, which biases towards groups of low
    variance (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783)."""
    mean, _, _ = group_stats(rewards, group_ids)
    return _broadcast(rewards.double() - mean, loss_mask)


def rloo(rewards, group_ids, loss_mask, **_):
    """RLOO: A_i = r_i - mean_{j≠i} r_j = n/(n-1) · (r_i - mean(r_group)), the leave-one-out baseline
    (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740). 0 for groups of one."""
    mean, _, n = group_stats(rewards, group_ids)
    n = n.double()
    adv = torch.where(n > 1, (rewards.double() - mean) * n / (n - 1).clamp(min=1), torch.zeros_like(mean))
    return _broadcast(adv, loss_mask)


def liteppo(rewards, group_ids, loss_mask, *, eps: float = 1e-6, **_):
    """LitePPO: group mean, batch std: A_i = (r_i - mean(r_group)) / (std(r_batch) + eps), unbiased std over
    all samples of the batch (Liu et al. 2025, "Tricks or Traps?", arXiv 2508.08221, §4.1)."""
    mean, _, n = group_stats(rewards, group_ids)
    r = rewards.double()
    stats = torch.stack([r.sum(), (r**2).sum(), torch.tensor(float(len(r)), dtype=torch.float64)])
    _all_reduce(stats)
    s, sq, count = stats.tolist()
    var = max(sq / count - (s / count) ** 2, 0.0) * (count / (count - 1) if count > 1 else 0.0)
    adv = torch.where(n > 1, (r - mean) / (var**0.5 + eps), torch.zeros_like(mean))
    return _broadcast(adv, loss_mask)


def discounted_returns(token_rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = Σ_{s>=t, s masked} γ^(k(s)-k(t)) r_s over the completion tokens of each row, where k counts
    completion tokens (masked-out positions are skipped, not discounted)."""
    out = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0], dtype=torch.float64)
    m = loss_mask.bool()
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = torch.where(m[:, t], token_rewards[:, t].double() + gamma * running, running)
        out[:, t] = torch.where(m[:, t], running, torch.zeros_like(running)).float()
    return out


def reinforce_pp(rewards, group_ids, loss_mask, *, token_rewards=None, gamma: float = 1.0, eps: float = 1e-6, **_):
    """REINFORCE++: per-token returns of the token rewards (the sequence reward on the last token, -β·KL
    on each), whitened over every completion token of the batch (Hu et al. 2025, arXiv 2501.03262, §3)."""
    if token_rewards is None:
        from asyncrl.algo.shaping import place_at_last_token

        token_rewards = place_at_last_token(rewards, loss_mask)
    return masked_whiten(discounted_returns(token_rewards, loss_mask, gamma), loss_mask, eps)


def reinforce_pp_baseline(rewards, group_ids, loss_mask, *, eps: float = 1e-6, **_):
    """REINFORCE++-baseline: subtract the group mean reward, then whiten over every completion token of the
    batch (Hu et al. 2025, arXiv 2501.03262 v3, §3.2). 0 for groups of one."""
    mean, _, n = group_stats(rewards, group_ids)
    centred = torch.where(n > 1, rewards.double() - mean, torch.zeros_like(mean))
    return masked_whiten(_broadcast(centred, loss_mask), loss_mask, eps)


def gae(rewards, group_ids, loss_mask, *, token_rewards=None, values=None, gamma: float = 1.0, lam: float = 1.0, **_):
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438, Eq. 16) over the
    completion tokens of each row, with V = 0 after the last one:

        δ_t = r_t + γ V_{t+1} - V_t,    A_t = δ_t + γλ A_{t+1}.

    ``values`` (N, T) come from the critic (None = 0, giving discounted returns). Returns = A + V.
    """
    if token_rewards is None:
        from asyncrl.algo.shaping import place_at_last_token

        token_rewards = place_at_last_token(rewards, loss_mask)
    v = torch.zeros_like(token_rewards, dtype=torch.float64) if values is None else values.double()
    out = torch.zeros_like(token_rewards, dtype=torch.float32)
    m = loss_mask.bool()
    next_v = torch.zeros(token_rewards.shape[0], dtype=torch.float64)
    next_a = torch.zeros_like(next_v)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t].double() + gamma * next_v - v[:, t]
        a = delta + gamma * lam * next_a
        next_a = torch.where(m[:, t], a, next_a)
        next_v = torch.where(m[:, t], v[:, t], next_v)
        out[:, t] = torch.where(m[:, t], a, torch.zeros_like(a)).float()
    return out


ADVANTAGES = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "liteppo": liteppo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "gae": gae,
}
GROUP_BASELINES = frozenset({"grpo", "dr_grpo", "rloo", "liteppo", "reinforce_pp_baseline"})
"""Estimators whose baseline is the sample's group: with one sample per prompt every advantage is 0."""
CRITIC_ESTIMATORS = frozenset({"gae"})
"""Estimators that use the critic's values."""
