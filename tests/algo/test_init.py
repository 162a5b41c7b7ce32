import math

import torch

from asyncrl.algo.advantages import grpo
from asyncrl.algo.losses import decoupled_ppo, ppo
from asyncrl.algo.offpolicy import BehaviourCorrection


def test_grpo_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    mask = torch.ones(6, 2)
    adv = grpo(rewards, groups, mask)
    std = math.sqrt(((0.5**2) * 4) / 3)  # unbiased std of [1, 0, 0, 1]
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]) / (torch.tensor([std] * 4 + [0.0, 0.0]) + 1e-6)
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    assert torch.equal(adv[:, 0], adv[:, 1])


def test_grpo_respects_mask_and_single_sample_groups():
    adv = grpo(torch.tensor([3.0]), torch.tensor([0]), torch.tensor([[1.0, 0.0]]))
    assert adv.tolist() == [[0.0, 0.0]]


def test_decoupled_loss_hand_computed():
    # one token, A = 1: u = π_θ/π_prox = 1.5 is clipped to 1.2; w = π_prox/π_behav = 2, cap 5
    lp, prox, behav = math.log(0.6), math.log(0.4), math.log(0.2)
    loss, stats = decoupled_ppo(
        logprobs=torch.tensor([[lp]]), prox_logprobs=torch.tensor([[prox]]), behav_logprobs=torch.tensor([[behav]]),
        advantages=torch.tensor([[1.0]]), mask=torch.tensor([[1.0]]), eps_clip=0.2,
        correction=BehaviourCorrection(upper=5.0),
    )
    # max(-1 * 1.5, -1 * 1.2) = -1.2, times w = 2
    assert loss.item() == pytest_approx(-2.4)
    assert stats["clip_frac"] == 1.0 and stats["behav_weight_mean"] == pytest_approx(2.0)


def test_decoupled_loss_negative_advantage_and_cap():
    # A = -2, u = 0.5 -> clipped to 0.8: max(1.0, 1.6) = 1.6; w = 10 capped at 3 -> 4.8
    loss, stats = decoupled_ppo(
        logprobs=torch.tensor([[math.log(0.1)]]), prox_logprobs=torch.tensor([[math.log(0.2)]]),
        behav_logprobs=torch.tensor([[math.log(0.02)]]), advantages=torch.tensor([[-2.0]]),
        mask=torch.tensor([[1.0]]), eps_clip=0.2, correction=BehaviourCorrection(upper=3.0),
    )
    assert loss.item() == pytest_approx(4.8)
    assert stats["behav_weight_capped_frac"] == 1.0


def test_decoupled_loss_gradient_flows_only_through_current_policy():
    lp = torch.tensor([[math.log(0.5), math.log(0.3)]], requires_grad=True)
    loss, _ = decoupled_ppo(
        logprobs=lp, prox_logprobs=lp.detach(), behav_logprobs=torch.tensor([[math.log(0.25), math.log(0.3)]]),
        advantages=torch.tensor([[1.0, 1.0]]), mask=torch.tensor([[1.0, 0.0]]),
        correction=BehaviourCorrection(upper=5.0),
    )
    loss.sum().backward()
    # d/dlp of -A * w * exp(lp - prox) at lp == prox is -A * w = -2 on the unmasked token, 0 on the masked one
    assert torch.allclose(lp.grad, torch.tensor([[-2.0, 0.0]]))


def test_losses_sanitise_inf_logprobs():
    loss, _ = decoupled_ppo(
        logprobs=torch.tensor([[0.0]]), prox_logprobs=torch.tensor([[float("-inf")]]),
        behav_logprobs=torch.tensor([[float("-inf")]]), advantages=torch.tensor([[1.0]]),
        mask=torch.tensor([[1.0]]), correction=BehaviourCorrection(upper=5.0),
    )
    assert torch.isfinite(loss).all()


def test_naive_ppo_anchors_on_behaviour():
    loss, _ = ppo(logprobs=torch.tensor([[math.log(0.3)]]), prox_logprobs=torch.tensor([[0.0]]),
                  behav_logprobs=torch.tensor([[math.log(0.2)]]), advantages=torch.tensor([[1.0]]),
                  mask=torch.tensor([[1.0]]), eps_clip=0.2)
    assert loss.item() == pytest_approx(-1.2)


def pytest_approx(x):
    import pytest

    return pytest.approx(x, rel=1e-5, abs=1e-6)


# ---- registries, the group filter and the actor guardrails -----------------------------------------------
def test_registries_list_every_algorithm():
    from asyncrl.algo import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "liteppo", "reinforce_pp", "reinforce_pp_baseline", "gae"}
    assert set(POLICY_LOSSES) == {"decoupled_ppo", "ppo", "sapo", "cispo", "pg"}
    assert set(AGGREGATIONS) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_group_filter_implements_dynamic_sampling():
    from asyncrl.algo import build_group_filter
    from asyncrl.trainer.config import ActorConfig
    from asyncrl.types import Trajectory, TrajectoryGroup

    def group(*rewards):
        return TrajectoryGroup([Trajectory([1], [2], [-0.1], [0], r) for r in rewards])

    assert build_group_filter(ActorConfig()) is None
    keep = build_group_filter(ActorConfig(dynamic_sampling=True))
    assert keep(group(0.0, 1.0, 1.0)) and keep(group(0.2, 0.3))
    assert not keep(group(1.0, 1.0, 1.0)) and not keep(group(0.0, 0.0)) and not keep(group(1.0))


def _validate(**kw):
    from asyncrl.trainer.config import ActorConfig

    eta = kw.pop("eta", 2)
    n = kw.pop("n", 8)
    mnt = kw.pop("max_new_tokens", 64)
    ActorConfig(**kw).validate(max_staleness=eta, n_samples=n, max_new_tokens=mnt)


def test_guardrails_say_why_and_what_to_set():
    import pytest

    from asyncrl.configlib import ConfigError

    cases = [
        (dict(policy_loss="ppo"), "no off-policy correction.*max_head_offpolicyness=0"),
        (dict(behav_imp_weight_cap=None), "unbounded behaviour importance weight.*behav_imp_weight_cap"),
        (dict(kl_ctl=0.01), "no reference model.*actor.ref_model=init"),
        (dict(adv_estimator="gae"), "without a critic.*actor.critic"),
        (dict(critic="value_head"), "never uses.*adv_estimator=gae"),
        (dict(adv_estimator="rloo", n=1), "n_samples=1"),
    ]
    for kw, message in cases:
        with pytest.raises(ConfigError, match=message):
            _validate(**kw)
        _validate(allow_unsafe=True, **kw)  # the expert override
    _validate(policy_loss="ppo", eta=0)  # naive PPO is fine on-policy
    _validate(kl_ctl=0.01, ref_model="init", use_kl_loss=True, kl_estimator="k3")
    _validate(adv_estimator="gae", critic="separate")
    _validate(adv_estimator="reinforce_pp", n=1)


def test_actor_values_are_checked_with_the_key_named():
    import pytest

    from asyncrl.configlib import ConfigError

    for kw, message in [
        (dict(c_clip=0.5), "actor.c_clip"),
        (dict(loss_agg_mode="seq-mean"), "actor.loss_agg_mode 'seq-mean' is not one of"),
        (dict(kl_estimator="k4"), "actor.kl_estimator"),
        (dict(behav_imp_weight_metric="kl_k3"), "behav_imp_weight_mode=mask"),
        (dict(behav_imp_weight_metric="kl_k3", behav_imp_weight_mode="mask", behav_imp_weight_floor=6.0),
         "behav_imp_weight_floor exceeds"),
        (dict(behav_imp_weight_floor=6.0), "behav_imp_weight_floor=6.0 must be < 1"),
        (dict(overlong_reward_penalty=True), "overlong_tokens > 0"),
        (dict(overlong_reward_penalty=True, overlong_tokens=100), "exceeds gconfig.max_new_tokens=64"),
        (dict(discount=1.5), "actor.discount must be in"),
        (dict(ref_model="/no/such/dir"), "actor.ref_model"),
        (dict(importance_sampling_level="seq"), "actor.importance_sampling_level"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _validate(**kw)
