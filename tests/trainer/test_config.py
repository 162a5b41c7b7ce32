"""The actor section (asyncrl.trainer.config): guardrails say why and what to set, values are checked with the key
named, the off-policy guardrails, and a critic path without a critic."""

from pathlib import Path

import pytest

from asyncrl import configlib
from asyncrl.algo.algorithm import build_algorithm
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.report.diagnose import trusted
from asyncrl.trainer.config import ActorConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


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
        (
            dict(behav_imp_weight_metric="kl_k3", behav_imp_weight_mode="mask", behav_imp_weight_floor=6.0),
            "behav_imp_weight_floor exceeds",
        ),
        (dict(behav_imp_weight_floor=6.0), "behav_imp_weight_floor=6.0 must be < 1"),
        (dict(overlong_reward_penalty=True), "overlong_tokens > 0"),
        (dict(overlong_reward_penalty=True, overlong_tokens=100), "exceeds gconfig.max_new_tokens=64"),
        (dict(discount=1.5), "actor.discount must be in"),
        (dict(ref_model="/no/such/dir"), "actor.ref_model"),
        (dict(importance_sampling_level="seq"), "actor.importance_sampling_level"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _validate(**kw)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["actor.behav_imp_weight_cap=0.5", "actor.behav_imp_weight_mode=mask"], "drops every on-policy token"),
        (["actor.behav_imp_weight_cap=0"], "zeroes all learning"),
        (["actor.behav_imp_weight_cap=1.0"], "shrinks the weight of every on-policy token"),
        (["actor.behav_imp_weight_floor=1.0"], "floor at or above 1"),
        (["actor.behav_imp_weight_level=sequence", "actor.behav_imp_weight_agg=max"], "clamping it changes nothing"),
        (["actor.lr=2"], "above 1"),
    ],
)
def test_off_policy_guardrails(overrides, match):
    with pytest.raises(ConfigError, match=match):
        configlib.load(TrainConfig, None, overrides)


def test_a_kl_cap_below_one_is_fine():
    configlib.load(
        TrainConfig,
        None,
        ["actor.behav_imp_weight_metric=kl_k3", "actor.behav_imp_weight_mode=mask", "actor.behav_imp_weight_cap=0.05"],
    )


def test_critic_path_without_a_critic_is_refused():
    from asyncrl.configlib import ConfigError

    with pytest.raises(ConfigError, match="actor.critic_path"):
        ActorConfig(critic_path="/x").validate(max_staleness=0, n_samples=4)


def test_behaviour_trust_terms_are_checked_and_apply_to_the_decoupled_losses_only():
    for kw, message in (
        (dict(behav_eps_clip=1.5), "actor.behav_eps_clip must be in"),
        (dict(behav_prob_delta=0.0), "actor.behav_prob_delta must be in"),
        (dict(behav_m2_budget=-1.0), "actor.behav_m2_budget must be > 0"),
        (dict(policy_loss="ppo", eta=0, behav_eps_clip=0.2), "anchored on the behaviour policy already"),
        (dict(policy_loss="m2po", behav_prob_delta=0.1), "actor.behav_prob_delta bounds the drift"),
    ):
        with pytest.raises(ConfigError, match=message):
            _validate(**kw)
    _validate(behav_eps_clip=0.2, behav_prob_delta=0.1, behav_m2_budget=0.04)
    _validate(policy_loss="m2po", behav_m2_budget=0.1)  # m2po's own budget
    _validate(policy_loss="m2po")  # stale samples are what m2po is for
    for raw, message in (
        ("strict", "'actor.behav_eps_clip' must be float or 'auto', got 'strict'"),
        ("true", "'actor.behav_eps_clip' must be float or 'auto', got True"),
        ("Infinity", "'actor.behav_eps_clip' must be a finite number, got inf"),  # not the string 'Infinity'
    ):
        with pytest.raises(ConfigError) as e:
            configlib.load(TrainConfig, None, [f"actor.behav_eps_clip={raw}"])
        assert str(e.value) == f"command line: {message}"


def test_the_dual_anchor_is_on_by_default_for_the_decoupled_losses_only():
    """The default chosen by docs/algorithms.md "Which correction at which staleness": the trust region of naive
    PPO's clip (at actor.eps_clip) on the decoupled losses; the behaviour-anchored losses have it already."""
    assert ActorConfig().behav_eps_clip == "auto" and ActorConfig().dual_anchor() == 0.2
    assert ActorConfig(eps_clip=0.1).dual_anchor() == 0.1
    assert ActorConfig(policy_loss="cispo").dual_anchor() == 0.2
    assert (
        ActorConfig(policy_loss="ppo").dual_anchor() is None and ActorConfig(policy_loss="m2po").dual_anchor() is None
    )
    assert ActorConfig(behav_eps_clip=None).dual_anchor() is None  # AReaL's decoupled loss as it ships
    assert ActorConfig(behav_eps_clip=0.3).dual_anchor() == 0.3
    _validate(policy_loss="ppo", eta=0)  # auto on a behaviour-anchored loss: off, not refused
    cfg = configlib.load(TrainConfig, None, ["actor.behav_eps_clip=null"])
    assert cfg.actor.behav_eps_clip is None
    assert configlib.load(TrainConfig, None, ["actor.behav_eps_clip=0.1"]).actor.dual_anchor() == 0.1
    trust = build_algorithm(ActorConfig()).loss_options["trust"]
    assert trust.eps_clip == 0.2
    # an eps_clip that is not a ratio half-width below 1 (the CISPO preset: no lower bound on the weight) gets
    # no dual anchor from auto; the start-up line names a width to set instead
    cispo = configlib.load(TrainConfig, str(EXAMPLES / "cispo.yaml")).actor
    assert cispo.eps_clip == 1.0 and cispo.dual_anchor() is None and not cispo.trusted()
    (line,) = cispo.inert_terms(max_staleness=2)
    assert "actor.behav_eps_clip=0.2" in line
    assert ActorConfig(policy_loss="cispo", eps_clip=1.0, behav_eps_clip=0.2).trusted()


def test_a_saved_run_is_trusted_as_its_config_resolves():
    """diagnose reads the actor section of a run's config.yaml: auto resolves as the config does."""
    assert trusted({"policy_loss": "decoupled_ppo", "eps_clip": 0.2, "behav_eps_clip": "auto"})
    assert not trusted({"policy_loss": "decoupled_ppo", "eps_clip": 0.2})  # a run from before the default
    assert not trusted({"policy_loss": "cispo", "eps_clip": 1.0, "behav_eps_clip": "auto"})
    assert trusted({"policy_loss": "cispo", "eps_clip": 1.0, "behav_eps_clip": 0.2})
    assert trusted({"policy_loss": "decoupled_ppo", "behav_prob_delta": 0.1})
    assert not trusted({"policy_loss": "ppo", "behav_eps_clip": "auto"}) and not trusted("not a mapping")


def test_an_inert_clip_is_said_at_start_up():
    (line,) = ActorConfig(behav_eps_clip=None).inert_terms(max_staleness=2)
    assert "actor.eps_clip is inert here" in line and "actor.behav_eps_clip=auto" in line
    assert ActorConfig(behav_eps_clip=None).inert_terms(max_staleness=0) == []  # on-policy: nothing to bound
    assert ActorConfig(behav_eps_clip=None, ppo_n_minibatches=4).inert_terms(max_staleness=2) == []
    assert ActorConfig(behav_eps_clip=None, prox_logp_method="loglinear").inert_terms(max_staleness=2) == []
    assert ActorConfig().inert_terms(max_staleness=2) == []  # the default's dual anchor bounds the drift
    assert ActorConfig(behav_eps_clip=None, behav_prob_delta=0.1).inert_terms(max_staleness=2) == []
