"""Algorithms as pure tensor functions, chosen by name from registries.

- :mod:`.advantages` ``ADVANTAGES``: GRPO, Dr.GRPO, RLOO, LitePPO, REINFORCE++(-baseline), GAE;
- :mod:`.losses` ``POLICY_LOSSES``: decoupled PPO (+ GSPO's sequence level, DAPO's clip-higher, dual
  clip), SAPO, CISPO, plain policy gradient, naive PPO; the clipped value loss;
- :mod:`.offpolicy`: the behaviour importance weight (rejection / truncation), log-linear proximal log-probs;
- :mod:`.kl` ``KL_ESTIMATORS``: k1, k2, k3;
- :mod:`.aggregate` ``AGGREGATIONS``: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm;
- :mod:`.shaping`: reward scaling / bias / clip, DAPO's overlong penalty, zero reward when truncated;
- :mod:`.filters`: DAPO's dynamic sampling.

``config.ActorConfig`` is the ``actor`` config section; ``asyncrl.trainer.build_trainer`` turns it into
plain arguments for these functions.
"""

from __future__ import annotations

from typing import Callable

from asyncrl.algo.advantages import ADVANTAGES
from asyncrl.algo.aggregate import AGGREGATIONS
from asyncrl.algo.filters import rewards_vary
from asyncrl.algo.kl import KL_ESTIMATORS
from asyncrl.algo.losses import POLICY_LOSSES
from asyncrl.types import TrajectoryGroup

__all__ = ["ADVANTAGES", "AGGREGATIONS", "KL_ESTIMATORS", "POLICY_LOSSES", "build_group_filter"]


def build_group_filter(cfg) -> Callable[[TrajectoryGroup], bool] | None:
    """A predicate on finished groups for an ``ActorConfig`` (False = drop the group and admit another, as in
    DAPO's dynamic sampling), or None to keep every group."""
    return rewards_vary if cfg.dynamic_sampling else None
