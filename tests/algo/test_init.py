"""The registries and the group filter (asyncrl.algo): every algorithm is registered, and dynamic sampling drops the
groups whose rewards do not vary."""


# ---- registries, the group filter and the actor guardrails -----------------------------------------------
def test_registries_list_every_algorithm():
    from asyncrl.algo import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "liteppo", "reinforce_pp", "reinforce_pp_baseline", "gae"}
    assert set(POLICY_LOSSES) == {"decoupled_ppo", "ppo", "sapo", "cispo", "pg", "m2po"}
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
