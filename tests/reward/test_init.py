"""build_reward_service (asyncrl.reward) from the reward section."""

import pytest

from asyncrl import configlib
from asyncrl.configlib import ConfigError
from asyncrl.reward import build_reward_service
from asyncrl.reward.config import RewardConfig

from data_fixtures import reward_fns

ITEM = {"id": 7, "question": "q", "answer": "42", "prompt_ids": [1, 2, 3]}


def test_build_from_config():
    cfg = configlib.load(
        RewardConfig, None, ["fn=data_fixtures.reward_fns:scaled", "kwargs={scale: 2}", "workers=0", "timeout_s=5"]
    )
    s = build_reward_service(cfg, default_fn=reward_fns.raising)
    try:
        assert s.score({"question": "q", "answer": "a"}, "a") == 2.0
    finally:
        s.close()
    default = build_reward_service(RewardConfig(workers=0), default_fn=reward_fns.exact_answer)
    assert default.score(ITEM, "42") == 1.0
    with pytest.raises(ConfigError, match="reward.fn"):
        build_reward_service(RewardConfig(fn="data_fixtures.reward_fns:missing"), reward_fns.raising)
    with pytest.raises(ConfigError, match="reward.workers"):
        build_reward_service(RewardConfig(workers=-1), reward_fns.raising)
