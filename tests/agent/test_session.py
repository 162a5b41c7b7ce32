"""Episodes (asyncrl.agent.session): rewards flow back over an episode's calls with the discount."""

import pytest

from asyncrl.agent.session import Episode


def test_rewards_flow_back_over_calls_with_the_discount(tokenizer):
    episode = Episode("k", None)
    from asyncrl.agent.session import Call

    episode.calls = [Call(f"id{i}", [], "[]", [1], None, 0, [2], [0.0], [0], "stop") for i in range(3)]
    assert episode.returns(10.0, gamma=0.9) == pytest.approx([8.1, 9.0, 10.0])
    assert episode.returns({"id0": 1.0, "id2": 2.0}, gamma=0.5) == pytest.approx([1.5, 1.0, 2.0])
    with pytest.raises(ValueError, match="unknown completion ids"):
        episode.returns({"nope": 1.0})
