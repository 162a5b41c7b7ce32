"""Reference transcripts as the token ids the agent proxy would send and record, for SFT.

A transcript is the messages of one conversation: the opening turns (system/user), then assistant turns whose
``content`` is the exact text the model writes (tool calls included, as ``<tool_call>{...}</tool_call>``),
each followed by tool (or user) messages, ending with an assistant turn. Its tokens are built the way
:class:`asyncrl.agent.session.Episode` builds the prompts of an episode's calls: ``ChatRenderer.render`` of
the opening turns, then for every assistant turn the tokens of its text + the end-of-turn token (what the
engine generates and the trainer trains on), then ``ChatRenderer.continuation`` of the messages up to the
next assistant turn. So the tokens SFT trains on are the tokens RL samples and trains on.
"""

from __future__ import annotations

from asyncrl.agent.chat import ChatRenderer


def transcript_ids(
    renderer: ChatRenderer, messages: list[dict], tools: list[dict] | None = None
) -> tuple[list[int], list[int]]:
    """(token ids of the whole conversation, a 0/1 mask marking the assistant tokens to train on)."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("a transcript needs opening messages followed by at least one assistant turn")
    if messages[-1]["role"] != "assistant":
        raise ValueError("a transcript must end with an assistant turn")
    ids = renderer.render(messages[:first], tools)
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        reply = assistant_ids(renderer, messages[i]["content"])
        ids += reply
        mask += [1] * len(reply)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            bridge = renderer.continuation(messages[i + 1 : j], tools)
            ids += bridge
            mask += [0] * len(bridge)
        elif j < len(messages):
            raise ValueError(f"messages[{j}]: two assistant turns in a row")
        i = j
    return ids, mask


def assistant_ids(renderer: ChatRenderer, text: str) -> list[int]:
    """What the engine generates for an assistant turn of ``text``: its tokens and the end-of-turn token."""
    return renderer.tokenizer(text, add_special_tokens=False).input_ids + [renderer.stop_token_id]
