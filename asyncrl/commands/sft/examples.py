"""SFT's training examples: an item becomes token ids and what is trained on, prompt + response (the target
after the prompt's tokens) or a chat conversation (its assistant turns); the stream of examples skips, counts
and logs once each an item with nothing to train on and an example longer than ``max_length``."""

from __future__ import annotations

import logging
from typing import Callable, Iterator

import torch

from asyncrl.commands.sft.state import METRICS_FILE
from asyncrl.configlib import ConfigError
from asyncrl.data.formats import chat_prompt_ids, turn_end_id

log = logging.getLogger(__name__)

MAX_SKIPS_IN_A_ROW = 10_000  # examples skipped in a row before a generated source is declared unusable

Example = tuple[list[int], "int | list[int]"]  # (token ids, number of prompt tokens | 0/1 mask per token)


def sft_example(tokenizer, question: str, answer: str, prompt_ids: list[int] | None = None) -> tuple[list[int], int]:
    """(token ids of prompt + answer + the template's end of turn, number of prompt tokens); ``prompt_ids`` if
    already tokenised. The end of turn is the token the chat template closes an assistant turn with, which the
    run's generation stops at (asyncrl.data.formats.turn_end_id), not always the tokenizer's eos."""
    prompt = prompt_ids or chat_prompt_ids(tokenizer, question)
    target = tokenizer(answer, add_special_tokens=False).input_ids + [turn_end_id(tokenizer)]
    return prompt + target, len(prompt)


def chat_example(tokenizer, messages: list[dict]) -> tuple[list[int], list[int], int]:
    """(token ids of the whole conversation under the chat template, a 0/1 mask of the tokens trained on, the
    number of assistant turns left untrained).

    An assistant turn's tokens are found by rendering prefixes of the conversation: they start where the
    render of the turns before it with the generation prompt ends, and end where the render up to and
    including it ends, less what the template writes after the end-of-turn token (ChatML's newline is the
    next turn's prompt, never generated). Both renders must be token prefixes of the whole; a turn for which
    they are not (a template that renders a turn differently once later turns follow, e.g. Qwen3 dropping the
    reasoning of earlier turns) is left untrained and counted, since its tokens are not what the model would
    generate."""
    ids = _render(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(ids)
    eos, untrained = tokenizer.eos_token_id, 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not (message.get("content") or message.get("tool_calls")):
            continue  # an assistant turn with only tool calls is trained too: calling the tool is the target
        if message.get("weight") == 0:  # marked not to learn (OpenAI's fine-tuning format)
            continue
        try:
            start = _render(tokenizer, messages[:i], generation_prompt=True)
            end = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        except ValueError:
            untrained += 1
            continue
        a, b = len(start), len(end)
        if b <= a or ids[:a] != start or ids[:b] != end:
            untrained += 1
            continue
        span = ids[a:b]
        if eos in span:  # through the last end-of-turn token of the turn
            b = a + len(span) - span[::-1].index(eos)
        mask[a:b] = [1] * (b - a)
    return ids, mask, untrained


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
    except Exception as e:  # noqa: BLE001 - jinja raises many kinds for a chat it rejects
        raise ValueError(f"the chat template rejected the conversation ({type(e).__name__}: {e})") from e
    return tokenizer(text, add_special_tokens=False).input_ids


class NoTarget(ValueError):
    """An item with nothing to train on."""


def item_example(tokenizer, item: dict) -> tuple[Example, int]:
    """(the example of a prompt + response or chat item, assistant turns left untrained); NoTarget if it has
    nothing to train on."""
    if item.get("messages"):
        try:
            ids, mask, untrained = chat_example(tokenizer, item["messages"])
        except ValueError as e:
            raise NoTarget(str(e)) from None
        if not any(mask):
            raise NoTarget(
                f"none of its {untrained} assistant turn(s) is rendered by the chat template as it "
                "is within the whole conversation"
            )
        return (ids, mask), untrained
    target = item.get("solution") or item.get("answer")
    if target is None or not str(target).strip():
        raise NoTarget("no solution, response or answer text to train on")
    return sft_example(tokenizer, item["question"], str(target), item.get("prompt_ids")), 0


def sft_batch(examples: list[Example], pad_id: int):
    """Padded tensors of ``examples``: each (ids, number of prompt tokens) or (ids, 0/1 mask per token of the
    tokens trained on); the loss mask is over the predictions of tokens 1..T-1."""
    T = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(examples), T, dtype=torch.long)
    loss_mask = torch.zeros(len(examples), T - 1)
    for i, (ids, target) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        if isinstance(target, int):
            loss_mask[i, target - 1 : len(ids) - 1] = 1
        else:
            loss_mask[i, : len(ids) - 1] = torch.tensor(target[1:], dtype=loss_mask.dtype)
    return input_ids, attention_mask, loss_mask


class Examples:
    """Training examples from the item stream: items with nothing to train on and examples longer than
    ``max_length`` are skipped, counted and logged once each; a source that yields none is an error."""

    def __init__(
        self,
        items: Iterator[dict],
        build: Callable[[dict], tuple[Example, int]],
        max_length: int,
        data_stats: Callable[[], dict],
        source: str,
    ):
        self.items, self.build, self.max_length, self.data_stats = items, build, max_length, data_stats
        self.source = source
        self.counts = {"sft_skipped_long": 0, "sft_skipped_no_target": 0, "sft_turns_untrained": 0}
        self.items_read = 0  # the data position

    def skip(self, n: int) -> None:
        """Pass over the ``n`` items a resumed run had read."""
        for _ in range(n):
            next(self.items)
        self.items_read += n

    def take(self, n: int) -> list[Example]:
        out, in_a_row, epoch = [], 0, self._epoch()
        while len(out) < n:
            item = next(self.items)
            self.items_read += 1
            try:
                example, untrained = self.build(item)
            except NoTarget as e:
                self._skip("sft_skipped_no_target", f"item {_name(item)} has nothing to train on: {e}")
            else:
                if untrained:
                    self._count(
                        "sft_turns_untrained",
                        f"item {_name(item)}: {untrained} assistant turn(s) left "
                        "untrained, as the chat template renders them differently within the whole "
                        "conversation",
                        untrained,
                    )
                if len(example[0]) <= self.max_length:
                    out.append(example)
                    in_a_row, epoch = 0, self._epoch()
                    continue
                self._skip(
                    "sft_skipped_long",
                    f"an example of {len(example[0])} tokens is longer than max_length="
                    f"{self.max_length} (0 = the model's context)",
                )
            in_a_row += 1
            if in_a_row >= MAX_SKIPS_IN_A_ROW or self._epoch() >= epoch + 2:  # a whole pass found nothing
                raise ConfigError(
                    f"{self.source}: no usable training example in {in_a_row} items in a row "
                    f"({self._counts_text()}): give rows a target (a solution / response or answer "
                    "column, or chat messages ending with an assistant turn) or raise max_length"
                )
        return out

    def _skip(self, key: str, message: str) -> None:
        self._count(key, message, 1)

    def _count(self, key: str, message: str, n: int) -> None:
        self.counts[key] += n
        if self.counts[key] == n:
            log.warning("%s; further ones are counted in %s (%s)", message, key, METRICS_FILE)

    def _epoch(self) -> int:
        return int(self.data_stats().get("data_epoch", 0))

    def _counts_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "none skipped"

    def summary(self) -> None:
        if any(self.counts.values()):
            log.warning("sft: %s", self._counts_text())


def _name(item: dict) -> str:
    ident = item.get("source_id", item.get("id"))
    question = str(item.get("question", ""))
    return f"{ident} ({question[:40]!r}{'...' if len(question) > 40 else ''})"
