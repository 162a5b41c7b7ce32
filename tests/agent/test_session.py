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


def test_the_choices_of_a_completion_are_alternatives_not_steps():
    """Two choices of one request, then a request continuing one of them: a number goes to the last completion;
    each choice's return is its own reward + γ x the next completion's (the mean over its choices)."""
    from asyncrl.agent.session import Call

    episode = Episode("k", None)
    episode.calls = [
        Call("a", [], "[]", [1], None, 0, [2], [0.0], [0], "stop", choice=0),
        Call("a", [], "[]", [1], None, 0, [3], [0.0], [0], "stop", choice=1),
        Call("b", [], "[]", [1], None, 0, [4], [0.0], [0], "stop", choice=0),
        Call("b", [], "[]", [1], None, 0, [5], [0.0], [0], "stop", choice=1),
    ]
    assert episode.returns(1.0, gamma=0.5) == pytest.approx([0.5, 0.5, 1.0, 1.0])
    assert episode.returns({"a": [1.0, 0.0], "b": [0.0, 2.0]}, gamma=0.5) == pytest.approx([1.5, 0.5, 0.0, 2.0])


def test_concat_chains_branching_from_one_call_keep_their_own_rewards():
    """A call continued by a request with n = 4 choices: each chain (root + one choice) gets its choice's reward
    discounted back over the root, not the mean of the four."""
    from asyncrl.agent.session import Call

    episode = Episode("k", None)
    episode.calls = [Call("a", [], "[]", [1], None, 0, [2], [0.0], [0], "stop")]
    episode.calls += [Call("b", [], "[]", [1, 2, 9], 0, 1, [3 + i], [0.0], [0], "stop", choice=i) for i in range(4)]
    samples = episode.samples({"b": [1.0, 0.0, 0.0, 0.0]}, mode="concat", gamma=1.0)
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0, 0.0]
    assert [s.reward for s in episode.samples({"b": [1.0, 0.0, 0.0, 0.0]})] == [0.25, 1.0, 0.0, 0.0, 0.0]
