"""Rendering chats to token ids so that earlier turns are never re-tokenised.

A call's prompt is either a fresh render of its messages (the first call of a conversation, or after the
agent edited its history), or the previous call's exact prompt + output ids followed by ``continuation``:
the tokens of the new messages only, as the chat template renders them after a finished assistant turn.

How a template closes an assistant turn differs by model family (ChatML, used by Qwen2.5, Qwen3 and the tiny
models: ``<|im_end|>`` then ``\\n``; Llama 3: ``<|eot_id|>`` and nothing after it). Generation stops at the
end-of-turn token, so the text the template puts after it (ChatML's ``\\n``) is part of the next prompt,
never trained. Both are read off the template itself, by rendering a fixed short conversation around a
sentinel, so any template that closes turns the usual way works without a per-family table. Only the text
after the sentinel turn is used, so templates that render earlier assistant turns differently once later
messages exist (Qwen3 drops their reasoning) still bridge: the earlier turns keep the tokens the engine saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.data.chat import TemplateError, normalize  # noqa: F401 - the errors and turns of this module

SENTINEL = "\u2063asyncrl-sentinel\u2063"
BASE = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": SENTINEL}]


@dataclass(frozen=True)
class TurnEnd:
    """How the template ends an assistant turn: ``stop_text`` (the end-of-turn token, where generation stops)
    and ``boundary`` (what the template writes after it before the next message)."""

    stop_text: str
    boundary: str


class ChatRenderer:
    """Token ids of chats under ``tokenizer``'s chat template; ``stop_token_id`` ends assistant turns."""

    def __init__(self, tokenizer, stop_token_id: int):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.stop_token_id = stop_token_id
        self.turn_end = self._turn_end(tokenizer.decode([stop_token_id], skip_special_tokens=False))

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt ids of a fresh conversation, ready for the assistant's reply."""
        return self._ids(self._text(normalize(messages), tools, generation_prompt=True))

    def continuation(
        self, new_messages: list[dict], tools: list[dict] | None = None, ended_with_stop: bool = True
    ) -> list[int]:
        """The ids that follow a finished assistant turn (its output ids end with the end-of-turn token when
        ``ended_with_stop``; a turn cut at the length limit gets that token here) so that the whole equals the
        template's render of the conversation with ``new_messages`` added, up to the next generation prompt."""
        if not new_messages:
            raise TemplateError("a continuation needs at least one new message after the assistant turn")
        full = self._text(BASE + normalize(new_messages), tools, generation_prompt=True)
        after = full[full.index(SENTINEL) + len(SENTINEL) :]
        end = self.turn_end.stop_text + self.turn_end.boundary
        if not after.startswith(end):
            raise TemplateError(
                f"the chat template closes an assistant turn followed by these messages with "
                f"{after[:40]!r}, not {end!r}"
            )
        closing = ("" if ended_with_stop else self.turn_end.stop_text) + self.turn_end.boundary
        return self._ids(closing + after[len(end) :])

    # ---- internals -------------------------------------------------------------------------------------
    def _turn_end(self, stop_text: str) -> TurnEnd:
        text = self._text(BASE, None, generation_prompt=False)
        after = text[text.rindex(SENTINEL) + len(SENTINEL) :]
        if not after.startswith(stop_text):
            raise TemplateError(
                f"the chat template does not end an assistant turn with the stop token "
                f"{stop_text!r} (it writes {after[:40]!r} after the content)"
            )
        return TurnEnd(stop_text, after[len(stop_text) :])

    def _text(self, messages: list[dict], tools, generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as e:  # noqa: BLE001 - jinja raises many kinds for a chat it rejects
            raise TemplateError(f"the chat template rejected the conversation: {type(e).__name__}: {e}") from e

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids
