"""Generative rewards: an LLM judge behind any OpenAI-compatible endpoint scores each completion
(``reward.judge``; docs/rewards.md).

The judge is asked with a prompt template holding the question, the response and the reference answer, and
its answer is parsed into a reward in [0, 1]: a number in a range (``Score: 7`` of 0-10 -> 0.7) or a verdict
word (``correct`` -> 1, ``incorrect`` -> 0). An answer that cannot be parsed, an endpoint that keeps failing
after its retries, or a timeout raises :class:`JudgeError`: the reward service counts it as a failed reward
(``reward_errors``, logged with the judge's answer the first time) and the sample scores ``reward.default``;
it is never a silent 0. Answers are cached per process, keyed by (endpoint, model, prompt), so a repeated
(question, response) pair is judged once.

The judge may stand alone or beside a verifiable reward (``combine``): ``judge`` (the judge only),
``weighted`` (``(1 - weight) * verifier + weight * judge``), ``abstain`` (the judge only where the verifier
returns None). A :class:`JudgedReward` is a plain picklable reward function: it runs in the reward workers,
``reward.workers`` of them judging at once, each sample as soon as its group is generated while others
generate.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from asyncrl.reward.base import as_reward, facts

DEFAULT_TEMPLATE = (
    "You grade answers to questions. Compare the response with the reference answer.\n\n"
    "Question: {question}\n\nReference answer: {reference}\n\nResponse: {response}\n\n"
    "Reply with one line, 'Score: N', where N is an integer from 0 (wrong) to 10 (correct and complete)."
)
"""The default prompt: ``{question}``, ``{response}``, ``{reference}`` (the item's ``answer``) are filled in."""
NEGATIONS = {"not", "never"}
"""Words that, anywhere in the verdict's clause before it ("not at all correct"), make the answer unreadable
rather than that verdict; ``NEAR_NEGATIONS`` only just before it ("isn't correct", "no correct answer"), as
"there isn't any mistake and it is correct" and "no errors, so correct" are common."""
NEAR_NEGATIONS = {"no", "isn", "t"}  # "isn't" reads as isn, t; so do "doesn't", "wasn't"

VERDICTS = {"correct": 1.0, "incorrect": 0.0}
"""The default verdict words (``score=verdict``) and their rewards."""

CACHE_SIZE = 50_000
COMBINE = ("judge", "weighted", "abstain")


class JudgeError(RuntimeError):
    """The judge gave no usable score: unparseable, out of range, or the endpoint failed past its retries."""


@dataclass(frozen=True)
class Judge:
    """An OpenAI-compatible chat endpoint (``url`` up to ``/v1``) and how to ask it and read its answers."""

    url: str
    model: str = ""
    api_key_env: str = ""  # the environment variable holding the key (sent as a bearer token), if any
    template: str = DEFAULT_TEMPLATE
    score: str = "0-10"  # "LOW-HIGH": the last number in the answer, in that range | "verdict": a word of verdicts
    verdicts: dict = field(default_factory=lambda: dict(VERDICTS))
    max_tokens: int = 16
    temperature: float = 0.0
    timeout_s: float = 30.0
    retries: int = 2  # further tries after a connection error, a timeout, HTTP 429 or 5xx
    max_concurrency: int = 8  # requests in flight at once from one process

    def prompt(self, question: str, response: str, reference: Any) -> str:
        return self.template.format(
            question=question, response=response, reference="" if reference is None else reference
        )

    def ask(self, prompt: str) -> str:
        """The judge's answer to ``prompt`` (cached per process)."""
        key = (self.url, self.model, prompt)
        with _LOCK:
            if key in _CACHE:
                _CACHE.move_to_end(key)
                return _CACHE[key]
        with _semaphore(self.max_concurrency):
            answer = self._post(prompt)
        with _LOCK:
            _CACHE[key] = answer
            while len(_CACHE) > CACHE_SIZE:
                _CACHE.popitem(last=False)
        return answer

    def _post(self, prompt: str) -> str:
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.model:
            body["model"] = self.model
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.url.rstrip("/") + "/chat/completions"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
            request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                    reply = json.loads(r.read())
                return reply["choices"][0]["message"]["content"] or ""
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} from {url}: {e.read()[:200]!r}"
                if e.code != 429 and e.code < 500:
                    break  # a refused request does not get better by asking again
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"{url} unreachable: {getattr(e, 'reason', e)}"
            except (ValueError, KeyError, IndexError, TypeError) as e:
                last = f"{url} answered something that is not a chat completion ({type(e).__name__}: {e})"
                break
        raise JudgeError(f"the judge failed after {attempt + 1} tries: {last}")

    def parse(self, answer: str) -> float:
        """The reward in [0, 1] the judge's ``answer`` gives, or ``JudgeError`` naming why none."""
        if self.score == "verdict":
            clauses = [re.findall(r"[a-z_]+", c) for c in re.split(r"[.;:!?,\n]", answer.lower())]
            found = [(c, i) for c, words in enumerate(clauses) for i, w in enumerate(words) if w in self.verdicts]
            if not found:
                raise JudgeError(
                    f"the judge's answer names none of the verdicts {sorted(self.verdicts)}: {answer[:200]!r}"
                )
            c, i = found[-1]
            before, verdict = clauses[c][:i], clauses[c][i]
            if NEGATIONS & set(before) or NEAR_NEGATIONS & set(before[-3:]):  # "not (at all) correct" is no pass
                raise JudgeError(f"the judge's answer negates its verdict '{verdict}': {answer[:200]!r}")
            return float(self.verdicts[verdict])
        low, high = parse_range(self.score)
        labelled = re.findall(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", answer, flags=re.IGNORECASE)
        fractions = list(
            re.finditer(r"(-?\d+(?:\.\d+)?)\s*(?:/|out\s+of)\s*(\d+(?:\.\d+)?)", answer, flags=re.IGNORECASE)
        )
        after = answer[fractions[-1].end() :] if fractions else ""
        if re.search(r"(?:^|[.:;!?\n])\s*-?\d+(?:\.\d+)?\W*$", after):  # "1/2 of the steps right. 9": 9
            fractions = []  # a bare score closing the answer is the score; "7/10 - it misses step 3" is 7/10
        if not labelled and fractions:  # "7/10", "3 out of 10": the numerator, if it is out of the range's top
            numerator, denominator = fractions[-1].groups()
            if float(denominator) != high:
                raise JudgeError(
                    f"the judge's score {numerator}/{denominator} is not out of {high:g}: {answer[:200]!r}"
                )
            labelled = [numerator]
        numbers = labelled or re.findall(r"-?\d+(?:\.\d+)?", answer)
        if not numbers:
            raise JudgeError(f"the judge's answer holds no score: {answer[:200]!r}")
        value = float(numbers[-1])
        if not low <= value <= high or not math.isfinite(value):
            raise JudgeError(f"the judge's score {value:g} is outside {low:g}-{high:g}: {answer[:200]!r}")
        return (value - low) / (high - low)

    def __call__(self, question: str, response: str, reference: Any = None) -> float:
        return self.parse(self.ask(self.prompt(question, response, reference)))


def parse_range(spec: str) -> tuple[float, float]:
    """``"0-10"`` -> (0, 10); ValueError naming the spec otherwise."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*-\s*(-?\d+(?:\.\d+)?)\s*", spec)
    if not m or float(m.group(1)) >= float(m.group(2)):
        raise ValueError(f"a score range is LOW-HIGH with LOW < HIGH (e.g. 0-10) or 'verdict', got {spec!r}")
    return float(m.group(1)), float(m.group(2))


@dataclass(frozen=True)
class JudgedReward:
    """A reward function that asks ``judge``, alone or combined with ``verifier`` (``combine``, ``weight``)."""

    judge: Judge
    verifier: Callable[..., Any] | None = None
    combine: str = "judge"
    weight: float = 0.5

    def __call__(self, prompt: str, completion: str, **fields: Any) -> float:
        if self.combine == "judge" or self.verifier is None:
            return self.judge(prompt, completion, fields.get("answer"))
        verified = self.verifier(prompt, completion, **fields)
        if self.combine == "abstain":
            return self.judge(prompt, completion, fields.get("answer")) if verified is None else as_reward(verified)
        return (1 - self.weight) * as_reward(verified) + self.weight * self.judge(
            prompt, completion, fields.get("answer")
        )

    def describe(self, **_) -> dict:
        return facts(self.verifier)


_CACHE: OrderedDict = OrderedDict()
_LOCK = threading.Lock()
_SEMAPHORES: dict[int, threading.BoundedSemaphore] = {}


def _semaphore(n: int) -> threading.BoundedSemaphore:
    with _LOCK:
        return _SEMAPHORES.setdefault(n, threading.BoundedSemaphore(max(1, n)))
