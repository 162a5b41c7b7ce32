"""The policy trainer (asyncrl.trainer.policy) on a tiny random model: packed and padded computations agree,
micro-batching does not change the result, the proximal and reference passes do what the configuration asks, a
non-finite minibatch ends the step, and every loss and estimator learns a one-token bandit."""

import copy
import math

import pytest
import torch

from asyncrl.algo.advantages import reinforce_pp
from asyncrl.algo.aggregate import AGGREGATIONS
from asyncrl.algo.algorithm import Algorithm
from asyncrl.algo.kl import k1, k3
from asyncrl.trainer import PolicyTrainer
from asyncrl.types import Batch

from conftest import make_model
from trainers_for_tests import make_batch

LONG_TAIL = [9, 12, 12, 14, 15, 16, 18, 20, 22, 25, 30, 41, 60, 95, 150, 200]  # many short, a few long


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("mb_max_tokens", [8192, 256])
def test_packed_and_padded_logprobs_agree(mb_max_tokens):
    model = make_model()
    batch = make_batch(LONG_TAIL)
    padded = PolicyTrainer(model, mb_max_tokens=mb_max_tokens).logprobs(batch)
    packed = PolicyTrainer(model, mb_max_tokens=mb_max_tokens, pack_sequences=True).logprobs(batch)
    valid = batch.attention_mask[:, 1:].bool()
    assert (packed - padded)[valid].abs().max() < 1e-6
    assert (packed[~valid] == 0).all() and (padded[~valid] == 0).all()


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_packed_and_padded_steps_compute_the_same_loss_and_gradients(agg):
    batch = make_batch(LONG_TAIL, seed=1)
    algo = Algorithm(agg_fn=AGGREGATIONS[agg], agg_options={"norm_tokens": 64})
    stats, gradients = [], []
    for pack_sequences, mb in ((False, 8192), (True, 8192), (True, 200), (False, 300)):
        model = make_model()
        trainer = PolicyTrainer(model, algo, pack_sequences=pack_sequences, mb_max_tokens=mb, max_grad_norm=0.0)
        stats.append(trainer.step(batch))
        gradients.append(grads(model))
    for s, g in zip(stats[1:], gradients[1:]):
        assert s["loss"] == pytest.approx(stats[0]["loss"], abs=1e-6)
        assert s["entropy"] == pytest.approx(stats[0]["entropy"], abs=1e-5)
        assert (g - gradients[0]).abs().max() < 1e-6
    assert stats[1]["pack_efficiency"] > stats[0]["pack_efficiency"]


def test_all_masked_batch_trains_nothing_and_reports_no_nan():
    batch = make_batch([10, 12, 9, 11])
    batch.loss_mask.zero_()
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    stats = PolicyTrainer(model, pack_sequences=True).step(batch)
    assert stats["loss"] == 0.0 and stats["grad_norm"] == 0.0
    assert all(math.isfinite(v) for v in stats.values())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_minibatches_recompute_the_proximal_policy_or_approximate_it(monkeypatch):
    batch = make_batch(LONG_TAIL[:8])
    recompute = PolicyTrainer(make_model(), ppo_n_minibatches=2, pack_sequences=True)
    calls = []
    original = recompute.logprobs
    monkeypatch.setattr(recompute, "logprobs", lambda b, model=None: calls.append(1) or original(b, model))
    stats = recompute.step(batch, version=2)
    assert calls == [1] and math.isfinite(stats["loss"])

    loglinear = PolicyTrainer(make_model(), Algorithm(prox_method="loglinear_ahead"), ppo_n_minibatches=2)
    monkeypatch.setattr(loglinear, "logprobs", lambda *a, **k: pytest.fail("loglinear must skip the pass"))
    stats = loglinear.step(batch, version=2)
    assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0


def test_kl_in_the_loss_against_an_identical_reference_is_zero():
    batch = make_batch([12, 14, 10, 16])
    model = make_model()
    algo = Algorithm(kl_fn=k3, kl_ctl=0.1, kl_in_loss=True)
    with_kl = PolicyTrainer(model, algo, ref_model=copy.deepcopy(model))
    stats = with_kl.step(batch)
    assert stats["kl_loss"] == pytest.approx(0.0, abs=1e-6)
    # k3's gradient vanishes at π = π_ref, so the first step's gradient is the policy loss's alone
    plain = make_model()
    PolicyTrainer(plain, Algorithm()).step(batch)
    assert (grads(model) - grads(plain)).abs().max() < 1e-6


def test_kl_in_the_reward_lowers_the_reward_of_tokens_that_moved_away():
    batch = make_batch([12, 14])
    ref = make_model(seed=5)
    trainer = PolicyTrainer(make_model(), Algorithm(adv_fn=reinforce_pp, kl_fn=k1, kl_ctl=0.5), ref_model=ref)
    ref_logp = trainer.logprobs(batch, ref)
    adv, _, stats = trainer._advantages(batch, ref_logp, None)
    mask = batch.loss_mask
    kl = k1(batch.behav_logprobs, ref_logp) * mask
    token_rewards = -0.5 * kl
    last = mask.cumsum(-1).argmax(-1)
    token_rewards[torch.arange(2), last] += batch.rewards
    assert torch.allclose(adv, reinforce_pp(batch.rewards, batch.group_ids, mask, token_rewards=token_rewards))
    assert stats["ref_kl"] == pytest.approx(float(kl.sum() / mask.sum()), rel=1e-5)


def _bandit(algo: Algorithm, steps: int = 6, **trainer_kw) -> tuple[float, float]:
    """P(first completion token < 160) before and after ``steps`` on-policy steps rewarding exactly that."""
    model = make_model(seed=0)
    trainer = PolicyTrainer(model, algo, lr=3e-3, pack_sequences=True, **trainer_kw)
    g = torch.Generator().manual_seed(0)
    prompt, G, n = torch.tensor([5, 6, 7]), 4, 8
    probs = []
    for step in range(steps + 1):
        with torch.no_grad():
            logp = model(input_ids=prompt[None]).logits[0, -1].float().log_softmax(-1)
        probs.append(float(logp[:160].exp().sum()))
        tokens = torch.multinomial(logp.exp(), G * n, replacement=True, generator=g)
        ids = torch.cat([prompt.repeat(G * n, 1), tokens[:, None]], 1)
        loss_mask = torch.zeros(G * n, 3)
        loss_mask[:, 2] = 1
        batch = Batch(
            ids,
            torch.ones_like(ids),
            loss_mask,
            loss_mask * logp[tokens][:, None],
            torch.where(loss_mask > 0, step, -1),
            (tokens < 160).float(),
            torch.arange(G * n) // n,
            torch.zeros(G * n, dtype=torch.bool),
        )
        if step < steps:
            trainer.step(batch, version=step)
    return probs[0], probs[-1]


@pytest.mark.parametrize("loss", ["decoupled_ppo", "ppo", "sapo", "cispo", "pg"])
def test_every_loss_learns_a_one_token_bandit(loss):
    from asyncrl.algo import POLICY_LOSSES

    before, after = _bandit(Algorithm(loss_fn=POLICY_LOSSES[loss]))
    assert after > before + 0.05  # 0.50 -> 0.57 (seeded)


@pytest.mark.parametrize("estimator", ["dr_grpo", "rloo", "liteppo", "reinforce_pp", "reinforce_pp_baseline", "gae"])
def test_every_estimator_learns_a_one_token_bandit(estimator):
    from asyncrl.algo import ADVANTAGES

    critic = "value_head" if estimator == "gae" else "none"
    before, after = _bandit(Algorithm(adv_fn=ADVANTAGES[estimator], adv_norm=estimator == "gae"), critic=critic)
    assert after > before + 0.05  # 0.50 -> 0.57 (seeded)


def test_a_non_finite_minibatch_ends_the_step_and_earlier_minibatches_stay_applied():
    from asyncrl.algo.algorithm import Algorithm
    from asyncrl.algo.losses import decoupled_ppo
    from asyncrl.data.collate import collate
    from asyncrl.trainer import PolicyTrainer
    from asyncrl.types import Trajectory, TrajectoryGroup

    from conftest import make_model

    calls = []

    def nan_after_first(x, **kw):
        calls.append(1)
        per_token, stats = decoupled_ppo(x, **kw)
        return (per_token if len(calls) == 1 else per_token * math.nan), stats

    model = make_model(320)
    trainer = PolicyTrainer(model, Algorithm(loss_fn=nan_after_first), ppo_n_minibatches=3, lr=1e-2)
    groups = [
        TrajectoryGroup([Trajectory([1, 2, 3], [4, 5, 6], [-1.0] * 3, [0] * 3, float(r)) for r in (0, 1, 0)])
        for _ in range(2)
    ]
    batch = collate(groups, pad_id=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = trainer.step(batch)
    assert stats["nonfinite_skipped"] == 1 and len(calls) == 2  # the third minibatch never ran
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # the first one applied
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_finiteness_check_finds_nan_and_inf_and_passes_a_sum_that_overflows():
    from asyncrl.trainer.state import finite

    big = torch.full((4,), 3e38)  # every element finite, their sum is not
    assert finite(torch.randn(100)) and finite(big) and finite(torch.zeros(0)) and finite(torch.arange(5))
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.randn(100)
        x[37] = bad
        assert not finite(x) and not finite(x.to(torch.bfloat16))
    assert not finite(torch.tensor([math.inf, -math.inf]))  # a sum of NaN


# ---- off-policy corrections and their audit -------------------------------------------------------------------
def test_areal_loglinear_proximal_policy_binds_the_clip_at_one_step_per_batch(monkeypatch):
    """At one optimizer step per batch the recomputed proximal policy is the one trained (u = 1: the clip never
    binds); AReaL's loglinear proximal policy is one version behind, so stale tokens that moved are clipped."""
    batch = make_batch([14, 16, 12, 18], seed=2)
    with torch.no_grad():  # every token moved: π_θ/π_behav = e^0.5 = 1.65 since it was sampled two versions ago
        batch.behav_logprobs[:] = (PolicyTrainer(make_model()).logprobs(batch) - 0.5) * batch.loss_mask
    batch.versions[batch.loss_mask > 0] = 0
    recompute = PolicyTrainer(make_model(), ppo_n_minibatches=1).step(batch, version=2)
    loglinear = PolicyTrainer(make_model(), Algorithm(prox_method="loglinear"), ppo_n_minibatches=1)
    monkeypatch.setattr(loglinear, "logprobs", lambda *a, **k: pytest.fail("loglinear needs no proximal pass"))
    stats = loglinear.step(batch, version=2)
    # u = 1.65^(1/2) = 1.28 > 1.2: clipped on every token with A > 0 (those with A < 0 are not pushed further)
    assert recompute["clip_frac"] == 0.0 and stats["clip_frac"] == pytest.approx(stats["adv_pos_frac"], abs=1e-6)
    assert stats["clip_frac"] > 0


def test_every_step_reports_its_correction_audit():
    batch = make_batch([14, 16, 12, 18], seed=3)
    with torch.no_grad():  # behaviour weights e^2 = 7.4, above the cap of 5
        batch.behav_logprobs[:] = (PolicyTrainer(make_model()).logprobs(batch) - 2.0) * batch.loss_mask
    batch.versions[batch.loss_mask > 0] = 1
    batch.versions[0][batch.loss_mask[0] > 0] = 3  # one sample of the version trained (its KL: the same here)
    stats = PolicyTrainer(make_model()).step(batch, version=3)
    assert stats["ess"] == pytest.approx(1.0, abs=1e-5)  # equal weights: no token dominates
    assert 0 < stats["stale_tokens_frac"] < 1 and stats["adv_pos_frac"] + stats["adv_neg_frac"] <= 1
    assert stats["behav_weight_capped_frac"] == 1.0 and stats["behav_weight_delta"] > 0
    assert stats["behav_kl_stale"] == pytest.approx(math.exp(2) - 1 - 2, rel=1e-4)  # k3 of w = e^2


def test_ess_scaled_steps_take_smaller_steps_on_weights_a_few_tokens_dominate():
    """VCPO: the learning rate of a step is scaled by the ESS of its behaviour weights: 1 on-policy (the weights are
    all 1), below 1 on stale data; the update is smaller in proportion."""
    from asyncrl.algo.audit import ess

    on_policy = make_batch([14, 16, 12, 18], seed=4)
    model = make_model()
    with torch.no_grad():
        on_policy.behav_logprobs[:] = PolicyTrainer(model).logprobs(on_policy)
    stats = PolicyTrainer(copy.deepcopy(model), Algorithm(ess_lr=True)).step(on_policy)
    assert stats["lr_ess_scale"] == pytest.approx(1.0, abs=1e-5)
    stale = make_batch([14, 16, 12, 18], seed=4)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = PolicyTrainer(model, Algorithm(ess_lr=True), lr=1e-3, max_grad_norm=0.0)
    stats = trainer.step(stale)
    assert 0 < stats["lr_ess_scale"] < 0.99 and stats["lr_ess_scale"] == pytest.approx(stats["ess"], rel=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert ess(2.0, 2.0, 2) == 1.0
