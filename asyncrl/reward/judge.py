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

from asyncrl.reward import deadline
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
MAX_ANSWER_BYTES = 1 << 20
"""The most of a judge's reply read: a longer one is not a chat completion of max_tokens tokens."""


COMBINE = ("judge", "weighted", "abstain")


class JudgeError(RuntimeError):
    """The judge gave no usable score: unparseable, out of range, or the endpoint failed past its retries."""


class JudgeAmbiguous(JudgeError):
    """The judge's answer gives two different scores or verdicts (one may be quoted from the response it judges):
    read as neither, and counted apart (``reward_errors/JudgeAmbiguous``)."""


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
                with deadline.opener(self.timeout_s).open(request, timeout=self.timeout_s) as r:
                    raw = r.read(MAX_ANSWER_BYTES + 1)
                    if len(raw) > MAX_ANSWER_BYTES:
                        raise ValueError(f"a reply longer than {MAX_ANSWER_BYTES} bytes")
                    reply = json.loads(raw)
                return reply["choices"][0]["message"]["content"] or ""
            except urllib.error.HTTPError as e:
                if 300 <= e.code < 400:
                    last = (
                        f"HTTP {e.code} from {url}: the judge redirected to {e.headers.get('Location', '?')!r}; "
                        "redirects are refused (the request and its key go to reward.judge.url only)"
                    )
                    break
                last = f"HTTP {e.code} from {url}: {e.read(200)!r}"
                if e.code != 429 and e.code < 500:
                    break  # a refused request does not get better by asking again
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                timed_out = isinstance(reason, TimeoutError)
                last = (
                    f"{url} gave no whole answer within {self.timeout_s:g} s"
                    if timed_out
                    else f"{url} unreachable: {reason}"
                )
            except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
                last = f"{url} answered something that is not a chat completion ({type(e).__name__}: {e})"
                break
        raise JudgeError(f"the judge failed after {attempt + 1} tries: {last}")

    def check(self) -> str | None:
        """Why the endpoint cannot judge, found with one light request before anything runs (``GET /models``:
        unreachable, a redirect, the key refused), or None. Any other answer means someone listens there."""
        headers = {}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.url.rstrip("/") + "/models"
        try:
            wait = min(10.0, self.timeout_s)
            with deadline.opener(wait).open(urllib.request.Request(url, headers=headers), timeout=wait):
                return None
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                return f"it redirects ({e.code} to {e.headers.get('Location', '?')!r}), and redirects are refused"
            if e.code in (401, 403):
                return f"it refuses the key (HTTP {e.code}; the key is read from ${self.api_key_env or '(none)'})"
            return None
        except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError) as e:
            return f"it cannot be reached ({getattr(e, 'reason', e)})"

    def parse(self, answer: str) -> float:
        """The reward in [0, 1] the judge's ``answer`` gives, or ``JudgeError`` naming why none. An answer that
        gives two different scores or verdicts (a score quoted from the response beside the judge's own, "incorrect,
        although the method is correct") is ambiguous: refused (``JudgeAmbiguous``), never read as either."""
        if self.score == "verdict":
            return self._verdict(answer)
        return self._score(answer)

    def _verdict(self, answer: str) -> float:
        phrases = sorted(
            ((tuple(re.findall(r"[a-z_]+", k.lower())), v) for k, v in self.verdicts.items()),
            key=lambda kv: -len(kv[0]),
        )
        found = []  # (value, negated, phrase) in order
        for clause in re.split(r"[.;:!?,\n]", answer.lower()):
            words, i = re.findall(r"[a-z_]+", clause), 0
            while i < len(words):
                match = next(((p, v) for p, v in phrases if p and tuple(words[i : i + len(p)]) == p), None)
                if match is None:
                    i += 1
                    continue
                before = words[:i]
                negated = bool(NEGATIONS & set(before) or NEAR_NEGATIONS & set(before[-3:]))
                found.append((float(match[1]), negated, " ".join(match[0])))
                i += len(match[0])
        if not found:
            raise JudgeError(f"the judge's answer names none of the verdicts {sorted(self.verdicts)}: {answer[:200]!r}")
        value, negated, phrase = found[-1]
        if negated:  # "not (at all) correct" is no pass
            raise JudgeError(f"the judge's answer negates its verdict '{phrase}': {answer[:200]!r}")
        given = {v for v, neg, _ in found if not neg}
        if len(given) > 1:
            raise JudgeAmbiguous(
                f"the judge's answer gives conflicting verdicts ({', '.join(p for _, neg, p in found if not neg)}): "
                f"{answer[:200]!r}"
            )
        return value

    def _score(self, answer: str) -> float:
        low, high = parse_range(self.score)
        number = r"(-?\d+(?:\.\d+)?)(?![eE][-+]?\d)"  # not the mantissa of 1e1 (read as 1, then 0.1)
        out_of = rf"\s*(?:/|out\s+of)\s*{number}"
        labelled = list(re.finditer(rf"score\s*[:=]?\s*{number}(?:{out_of})?", answer, flags=re.IGNORECASE))
        if labelled:
            for m in labelled:
                if m.group(2) is not None and float(m.group(2)) != high:
                    raise JudgeError(
                        f"the judge's score {m.group(1)}/{m.group(2)} is not out of {high:g}: {answer[:200]!r}"
                    )
            values = {float(m.group(1)) for m in labelled}
            if len(values) > 1:
                raise JudgeAmbiguous(
                    f"the judge's answer gives {len(values)} different scores "
                    f"({', '.join(m.group(0) for m in labelled)}): {answer[:200]!r}"
                )
            return _scaled(float(labelled[-1].group(1)), low, high, answer)
        fractions = list(re.finditer(number + out_of, answer, flags=re.IGNORECASE))
        scores = [m for m in fractions if float(m.group(2)) == high]
        closing = re.search(rf"(?:^|[.:;!?\n])\s*{number}\W*$", answer[fractions[-1].end() :] if fractions else answer)
        if closing is not None:  # a bare score closing the answer ("... 1/2 of the steps right. 9"; "8")
            if scores and {float(m.group(1)) for m in scores} != {float(closing.group(1))}:
                raise JudgeAmbiguous(f"the judge's answer gives a score and another closing it: {answer[:200]!r}")
            return _scaled(float(closing.group(1)), low, high, answer)
        if scores:  # "7/10", "3 out of 10", "7/10 - it misses step 3"
            values = {float(m.group(1)) for m in scores}
            if len(values) > 1:
                raise JudgeAmbiguous(f"the judge's answer gives {len(values)} different scores: {answer[:200]!r}")
            return _scaled(float(scores[-1].group(1)), low, high, answer)
        if fractions:
            numerator, denominator = fractions[-1].groups()
            raise JudgeError(f"the judge's score {numerator}/{denominator} is not out of {high:g}: {answer[:200]!r}")
        raise JudgeError(
            f"the judge's answer holds no score (Score: N, N/{high:g}, or a number closing the answer): "
            f"{answer[:200]!r}"
        )

    def __call__(self, question: str, response: str, reference: Any = None) -> float:
        return self.parse(self.ask(self.prompt(question, response, reference)))


def _scaled(value: float, low: float, high: float, answer: str) -> float:
    if not math.isfinite(value) or not low <= value <= high:
        raise JudgeError(f"the judge's score {value:g} is outside {low:g}-{high:g}: {answer[:200]!r}")
    return (value - low) / (high - low)


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
