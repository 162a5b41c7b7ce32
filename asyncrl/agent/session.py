"""One agent episode's LLM calls, recorded token for token, and how they become training samples.

Each call keeps the prompt ids exactly as sent to the engine, the output ids, their behaviour log-probs and
per-token versions, and the finish reason. A call whose messages are an earlier call's messages + the reply
it got + new messages continues that call (its ``parent``): its prompt is the parent's prompt + output ids +
the new messages' tokens (``ChatRenderer.continuation``), never a re-tokenisation. Anything else (the agent
dropped, edited or summarised its history) is rendered fresh and starts a new chain.

Export (``agent.export``):
- ``individual``: one sample per call: the whole prompt masked, the call's output trained;
- ``concat``: one sample per chain of calls: the first prompt masked, every assistant output trained, the
  tokens between them (tool results, user turns, the template's turn boundaries) masked. A call on several
  chains (the agent branched) is trained on the first only.

Rewards: the episode returns one number (the reward of its last completion) or ``{completion_id: reward}`` per
completion (one with ``n`` choices: a list of ``n`` rewards, one per choice, in choice order); each call's return
is its own reward + γ · the return of the next completion (creation order; the mean over its choices), so the
episode's outcome flows back over earlier calls (γ = ``agent.turn_discount``), and no choice takes another's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from asyncrl.agent.chat import ChatRenderer, normalize
from asyncrl.types import Trajectory


@dataclass
class Call:
    id: str  # the completion id returned to the agent (shared by the choices of a request with n > 1)
    messages: list[dict]  # the request's messages, normalised
    tools_key: str  # the request's tools, as canonical JSON
    prompt_ids: list[int]
    parent: int | None  # the call this one continues token for token
    bridge: int  # how many of prompt_ids follow the parent's prompt + output (0 without a parent)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = ""
    reply: dict | None = None  # the assistant message returned, normalised (what the agent should send back)
    choice: int = 0  # this call's index among its completion's choices


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)


def _same_message(sent: dict, reply: dict) -> bool:
    """Whether the agent sent back the reply it got (tool-call ids and arguments' spelling aside)."""

    def key(m):
        calls = [(c["function"]["name"], canonical(c["function"]["arguments"])) for c in m.get("tool_calls", [])]
        return m["role"], m["content"].strip(), calls

    return key(sent) == key(reply)


class Episode:
    """The calls made with one API key."""

    def __init__(self, key: str, renderer: ChatRenderer):
        self.key, self.renderer = key, renderer
        self.calls: list[Call] = []
        self.history_edits = 0  # calls that could not continue an earlier one
        self.retries = 0  # client retries answered from an earlier call
        self.llm_s = 0.0  # time in the engine's generate (queued + generating)
        self.llm_queue_s = 0.0  # of which its requests waited for a free slot
        self.handler_s = 0.0  # time in the proxy's endpoints (the engine's time included)
        self._requests: dict[str, asyncio.Future] = {}  # request fingerprint -> the response (retries)
        self.ending = False  # the session's end was asked for: no new calls, those in flight finish

    def in_flight(self) -> list[asyncio.Future]:
        """The responses of the calls still being answered."""
        return [f for f in self._requests.values() if not f.done()]

    def plan(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], int | None, int]:
        """(prompt ids, parent call, bridge length) for a request; raises ``TemplateError``."""
        messages, tools_key = normalize(messages), canonical(tools or [])
        for i in range(len(self.calls) - 1, -1, -1):
            c = self.calls[i]
            n = len(c.messages)
            if (
                c.reply is not None
                and c.tools_key == tools_key
                and len(messages) > n + 1
                and messages[:n] == c.messages
                and _same_message(messages[n], c.reply)
            ):
                closed = bool(c.output_ids) and c.output_ids[-1] == self.renderer.stop_token_id  # not a stop string
                bridge = self.renderer.continuation(messages[n + 1 :], tools, ended_with_stop=closed)
                return c.prompt_ids + c.output_ids + bridge, i, len(bridge)
        if self.calls:
            self.history_edits += 1
        return self.renderer.render(messages, tools), None, 0

    def request(self, fingerprint: str, retried: bool) -> tuple[asyncio.Future, bool]:
        """(the future of this request's response, whether it is a client's retry answered by an identical
        earlier request). Only a request marked as a retry (``retried``) is answered from an earlier one: an
        agent that asks the same thing again wants a new sample, as the OpenAI API would give it."""
        earlier = self._requests.get(fingerprint)
        if retried and earlier is not None and not (earlier.done() and earlier.exception() is not None):
            self.retries += 1
            return earlier, True
        future = asyncio.get_running_loop().create_future()
        self._requests[fingerprint] = future
        return future, False

    @staticmethod
    def settle(future: asyncio.Future, response=None, error: BaseException | None = None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(response)
            if error is not None:
                future.exception()  # retrieved: a failed request that nobody retries is not an asyncio warning

    # ---- export ------------------------------------------------------------------------------------------
    def returns(self, outcome, gamma: float = 1.0) -> list[float]:
        """Each call's discounted return from the episode's outcome: its own reward + γ · the return of the next
        completion (creation order; of a completion with n choices, the mean of theirs: its choices are
        alternatives, not steps, so none takes another's reward). A number is the reward of the last completion
        (each of its choices)."""
        return self._discounted(self.rewards(outcome), gamma)

    def _discounted(self, rewards: list[float], gamma: float) -> list[float]:
        out, ahead = [0.0] * len(rewards), 0.0
        for calls in reversed(self._completions()):
            for i in calls:
                out[i] = rewards[i] + gamma * ahead
            ahead = sum(out[i] for i in calls) / len(calls)
        return out

    def rewards(self, outcome) -> list[float]:
        """Each call's own reward (before any discounting) from the episode's outcome."""
        if isinstance(outcome, dict):
            return self._rewards_by_id(outcome)
        rewards = [0.0] * len(self.calls)
        for i in (self._completions() or [[]])[-1]:
            rewards[i] = float(outcome)
        return rewards

    def _completions(self) -> list[list[int]]:
        """The calls grouped by completion (a request's choices are recorded one after another), in order."""
        groups: list[list[int]] = []
        for i, c in enumerate(self.calls):
            if groups and self.calls[groups[-1][-1]].id == c.id:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def _rewards_by_id(self, outcome: dict) -> list[float]:
        """Each call's reward from ``{completion_id: reward}``, or a list of rewards for a completion's choices."""
        choices: dict[str, list[int]] = {}  # completion id -> its calls, in choice order
        for i, c in enumerate(self.calls):
            choices.setdefault(c.id, []).append(i)
        unknown = sorted(set(outcome) - set(choices))
        if unknown:
            raise ValueError(f"the episode rewarded unknown completion ids {unknown[:3]}")
        rewards = [0.0] * len(self.calls)
        for key, value in outcome.items():
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            if len(values) != len(choices[key]):
                raise ValueError(
                    f"the episode gave completion {key} {len(values)} reward(s) for its "
                    f"{len(choices[key])} choice(s): give one number per choice (a list for n > 1)"
                )
            for i, v in zip(choices[key], values):
                rewards[i] = float(v)
        return rewards

    def samples(self, outcome, mode: str = "individual", gamma: float = 1.0) -> list[Trajectory]:
        if not any(c.output_ids for c in self.calls):
            return []
        rewards = self.rewards(outcome)
        returns = self._discounted(rewards, gamma)
        if mode == "individual":
            return [
                Trajectory(c.prompt_ids, c.output_ids, c.logprobs, c.versions, r, c.finish_reason)
                for c, r in zip(self.calls, returns)
                if c.output_ids
            ]
        return self._chains(returns, rewards, gamma)

    def _chains(self, returns: list[float], rewards: list[float], gamma: float) -> list[Trajectory]:
        """One sample per chain, rewarded with the chain's own return: its leaf's, discounted back over the
        chain's calls (two choices continuing one call are two chains with their own rewards, not the mean)."""
        children = {i for c in self.calls for i in [c.parent] if i is not None}
        trained: set[int] = set()
        samples = []
        for leaf in range(len(self.calls)):
            if leaf in children or not self.calls[leaf].output_ids:
                continue
            chain = [leaf]
            while self.calls[chain[-1]].parent is not None:
                chain.append(self.calls[chain[-1]].parent)
            chain.reverse()
            value = returns[leaf]
            for i in reversed(chain[:-1]):
                value = rewards[i] + gamma * value
            samples.append(self._concat(chain, trained, value))
        return samples

    def _concat(self, chain: list[int], trained: set[int], reward: float) -> Trajectory:
        root = self.calls[chain[0]]
        ids, logprobs, versions, mask = [], [], [], []
        for k, i in enumerate(chain):
            c = self.calls[i]
            if k:
                bridge = c.prompt_ids[len(c.prompt_ids) - c.bridge :]
                ids += bridge
                logprobs += [0.0] * len(bridge)
                versions += [-1] * len(bridge)
                mask += [0] * len(bridge)
            train = i not in trained
            trained.add(i)
            ids += c.output_ids
            logprobs += c.logprobs
            versions += c.versions if train else [-1] * len(c.versions)
            mask += [int(train)] * len(c.output_ids)
        last = self.calls[chain[-1]]
        return Trajectory(root.prompt_ids, ids, logprobs, versions, reward, last.finish_reason, loss_mask=mask)
