"""The OpenAI-compatible proxy's logic, without HTTP: per-episode keys, chat and text completions served by
the run's engine and recorded token for token (``session.Episode``).

Requests are checked field by field (``ProxyError`` carries the HTTP status and a message naming the field).
Sampling is the run's (``gconfig``): a request's ``temperature``, ``top_p`` and ``top_k`` are ignored, because
the trainer scores tokens at the run's temperature and nucleus, so anything else would make the recorded
behaviour log-probs wrong; ``max_tokens`` may only lower the run's ``gconfig.max_new_tokens``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import secrets
import time
import uuid

from asyncrl.agent.chat import ChatRenderer, TemplateError, normalize
from asyncrl.agent.fair import ShortestFirst
from asyncrl.agent.session import Call, Episode, canonical
from asyncrl.agent.tools import PARSERS, Reply
from asyncrl.types import SamplingParams

MAX_MESSAGES = 1024
MAX_TEXT_CHARS = 1 << 20  # characters of message text per request, checked before tokenising
FINISH = {"stop": "stop", "length": "length", "abort": "length"}


class ProxyError(Exception):
    """A request the proxy refuses: ``status`` (400, 401, 413) and a message naming the field."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, admin_key: str | None) -> None:
    """Refuse (ValueError) a proxy on a network interface without an admin key."""
    if not is_loopback(host) and not admin_key:
        raise ValueError(
            f"the agent proxy binds '{host}', which is not loopback: set an admin key too (anyone "
            "who can reach it could otherwise use the engine)"
        )


class AgentProxy:
    """Serves ``engine`` to episodes, one key each. ``params`` is the run's sampling (its ``n`` is ignored: a
    request's ``n`` says how many choices); ``max_len`` the engine's context per sequence."""

    def __init__(
        self,
        renderer: ChatRenderer,
        params: SamplingParams,
        max_len: int,
        *,
        tool_parser: str = "hermes",
        model_name: str = "policy",
        engine=None,
        max_chars: int = MAX_TEXT_CHARS,
    ):
        """``max_chars``: the characters of text a request may carry, refused before templating (a server
        exposing the proxy passes what its context can hold)."""
        if tool_parser not in PARSERS:
            raise ValueError(f"tool parser must be one of {sorted(PARSERS)}, got '{tool_parser}'")
        self.renderer, self.params, self.max_len = renderer, dataclasses.replace(params, n=1), max_len
        self.parse = PARSERS[tool_parser]
        self.model_name, self.engine = model_name, engine
        self.tokenizer = renderer.tokenizer
        self.episodes: dict[str, Episode] = {}
        self.calls = self.tool_parse_errors = 0
        self._tokenizing = ShortestFirst("asyncrl-proxy-tokenize")
        self.max_chars = min(max_chars, MAX_TEXT_CHARS)

    # ---- keys ----------------------------------------------------------------------------------------------
    def open(self) -> str:
        key = "sk-asyncrl-" + secrets.token_urlsafe(24)
        self.episodes[key] = Episode(key, self.renderer)
        return key

    def close(self, key: str) -> Episode:
        return self.episodes.pop(key)

    def shutdown(self) -> None:
        """Stop the tokenising thread (the proxy is done)."""
        self._tokenizing.shutdown()

    def episode(self, key: str | None) -> Episode:
        episode = self.episodes.get(key or "")
        if episode is None:
            raise ProxyError(401, "no live episode has this API key")
        if episode.ending:
            raise ProxyError(409, "this session is ending: its calls in flight finish, no new call starts")
        return episode

    # ---- endpoints -----------------------------------------------------------------------------------------
    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "asyncrl"}]}

    async def chat(self, key: str | None, body: dict, retried: bool = False) -> dict:
        """``/v1/chat/completions``: ``messages`` (+ ``tools``, ``tool_choice``, ``n``, ``stop``, ``max_tokens`` /
        ``max_completion_tokens``, ``logprobs``); the reply's tool calls parsed for the agent. A client's retry
        (``retried``: the OpenAI SDKs' ``x-stainless-retry-count`` header above 0) of an identical request gets
        that request's answer and makes no second sample; any other request is generated anew."""
        episode = self.episode(key)
        t0 = time.perf_counter()
        try:
            return await self._answer_chat(episode, body, retried)
        finally:
            episode.handler_s += time.perf_counter() - t0

    async def _answer_chat(self, episode: Episode, body: dict, retried: bool) -> dict:
        _check_common(body)
        messages, tools = _messages(body), _tools(body)
        chars = len(canonical(messages)) + len(canonical(tools or []))
        _check_chars(chars, "messages and tools", self.max_chars)
        _tool_choice(body, tools)
        fingerprint = canonical(
            [
                "chat",
                messages,
                tools,
                body.get("tool_choice"),
                body.get("n"),
                body.get("stop"),
                _max_tokens(body),
                bool(body.get("logprobs")),
            ]
        )
        future, is_retry = episode.request(fingerprint, retried)
        if is_retry:  # the same request again from a client's retry (after a timeout): the same answer
            return await future
        try:
            response = await self._chat(episode, body, messages, tools, chars)
        except BaseException as e:
            episode.settle(future, error=e)
            raise
        episode.settle(future, response)
        return response

    async def complete(self, key: str | None, body: dict) -> dict:
        """``/v1/completions``: ``prompt`` (text or token ids) continued as it is, no chat template."""
        episode = self.episode(key)
        t0 = time.perf_counter()
        try:
            return await self._answer_completion(episode, body)
        finally:
            episode.handler_s += time.perf_counter() - t0

    async def _answer_completion(self, episode: Episode, body: dict) -> dict:
        _check_common(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            _check_chars(len(prompt), "prompt", self.max_chars)
            ids = await self._off_loop(len(prompt), lambda: self.tokenizer(prompt, add_special_tokens=False).input_ids)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            vocab = len(self.tokenizer)
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise ProxyError(400, f"prompt: token id {bad} is not in the vocabulary (0 to {vocab - 1})")
            ids = list(prompt)
        else:
            raise ProxyError(400, "prompt must be a non-empty string or a list of token ids")
        params = self._params(body)
        choices = []
        calls = await self._generate(
            episode, ids, None, 0, [], "", params, _n(body), _max_tokens(body) is not None, "cmpl"
        )
        for index, call in enumerate(calls):
            choices.append(
                {
                    "index": index,
                    "text": self._decode(call.output_ids, params),
                    "finish_reason": FINISH.get(call.finish_reason, "stop"),
                    "logprobs": None,
                }
            )
        return {
            "id": calls[0].id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": _usage(ids, calls),
        }

    # ---- internals -----------------------------------------------------------------------------------------
    async def _chat(self, episode: Episode, body: dict, messages: list[dict], tools: list | None, chars: int) -> dict:
        try:  # templating and tokenising a long conversation takes seconds: never on the event loop
            prompt_ids, parent, bridge = await self._off_loop(chars, lambda: episode.plan(messages, tools))
        except TemplateError as e:
            raise ProxyError(400, f"messages: {e}") from None
        params = self._params(body)
        calls = await self._generate(
            episode,
            prompt_ids,
            parent,
            bridge,
            normalize(messages),
            canonical(tools or []),
            params,
            _n(body),
            _max_tokens(body) is not None,
        )
        choices = []
        for index, call in enumerate(calls):
            text = self._decode(call.output_ids, params)
            reply = self.parse(text) if tools and body.get("tool_choice") != "none" else Reply(text)
            self.tool_parse_errors += reply.malformed
            message = {"role": "assistant", "content": reply.content}
            if reply.tool_calls:
                message["tool_calls"] = reply.tool_calls
            call.reply = normalize([message])[0]
            finish = "tool_calls" if reply.tool_calls else FINISH.get(call.finish_reason, "stop")
            choice = {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "content": [
                        {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(call.output_ids, call.logprobs)
                    ]
                }
            choices.append(choice)
        return {
            "id": calls[0].id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": _usage(prompt_ids, calls),
        }

    async def _off_loop(self, chars: int, fn):
        """``fn()`` on the proxy's one tokenising thread (one: a fast tokenizer used by two threads at once can
        fail), so that the event loop, and the server's other routes, go on meanwhile; the job of fewest
        ``chars`` first, so that one session's long messages do not hold up the others' short calls."""
        return await asyncio.wrap_future(self._tokenizing.submit(chars, fn))

    def _params(self, body: dict) -> SamplingParams:
        stop = body.get("stop")
        stops = () if stop is None else (stop,) if isinstance(stop, str) else stop
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
            raise ProxyError(400, "stop must be a non-empty string or a list of at most 4 of them")
        limit = _max_tokens(body)
        max_new = self.params.max_new_tokens if limit is None else min(limit, self.params.max_new_tokens)
        return dataclasses.replace(self.params, max_new_tokens=max_new, stop=tuple(stops))

    async def _generate(
        self,
        episode: Episode,
        prompt_ids: list[int],
        parent,
        bridge: int,
        messages,
        tools_key,
        params: SamplingParams,
        n: int,
        params_asked: bool = True,
        kind: str = "chatcmpl",
    ) -> list[Call]:
        """``n`` calls of ``prompt_ids``, the choices of one completion (one id, ``KIND-...``); a request that set
        no ``max_tokens`` (``params_asked`` False) gets at most what is left of the context, as OpenAI's API does,
        instead of a refusal."""
        if self.engine is None:
            raise ProxyError(503, "the proxy has no engine yet")
        room = self.max_len - len(prompt_ids)
        if not params_asked and 0 < room < params.max_new_tokens:  # no max_tokens asked: what the context holds
            params = dataclasses.replace(params, max_new_tokens=room)
        if len(prompt_ids) + params.max_new_tokens > self.max_len:
            raise ProxyError(
                400,
                f"messages: the conversation is {len(prompt_ids)} tokens; with max_tokens "
                f"{params.max_new_tokens} it exceeds the context of {self.max_len} tokens"
                + (f" (ask for max_tokens <= {room})" if room > 0 else ""),
            )
        calls = []
        t0 = time.perf_counter()
        completions = await self.engine.generate(prompt_ids, dataclasses.replace(params, n=n))
        episode.llm_s += time.perf_counter() - t0
        episode.llm_queue_s += max(c.queued_s for c in completions)
        completion_id = f"{kind}-{uuid.uuid4().hex}"
        for index, c in enumerate(completions):
            call = Call(
                completion_id,
                messages,
                tools_key,
                list(prompt_ids),
                parent,
                bridge,
                c.output_ids,
                c.logprobs,
                c.versions,
                c.finish_reason,
                choice=index,
            )
            episode.calls.append(call)
            calls.append(call)
        self.calls += len(calls)
        return calls

    def _decode(self, ids: list[int], params: SamplingParams) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        hits = [text.find(s) for s in params.stop if s in text]
        return text[: min(hits)] if hits else text


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "messages must be a non-empty list")
    if len(messages) > MAX_MESSAGES:
        raise ProxyError(413, f"messages: {len(messages)} messages, more than {MAX_MESSAGES}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise ProxyError(400, f"messages[{i}] must be an object with role system, user, assistant or tool")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ProxyError(400, f"messages[{i}].content must be a string, a list of parts or null")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ProxyError(400, f"messages[{i}].content[{j}] must be a text part {{type: text, text: string}}")
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ProxyError(400, f"messages[{i}].tool_calls must be a list")
            for j, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(function, dict)
                    or not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments", ""), (str, dict))
                ):
                    raise ProxyError(
                        400,
                        f"messages[{i}].tool_calls[{j}] must be an object with a function "
                        "{name: string, arguments: string}",
                    )
    return messages


def _tools(body: dict) -> list | None:
    tools = _list(body, "tools")
    for i, tool in enumerate(tools or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
            or not isinstance(function.get("description", ""), str)
            or not isinstance(function.get("parameters", {}), dict)
        ):
            raise ProxyError(
                400,
                f"tools[{i}] must be {{type: function, function: {{name: string, description?: "
                "string, parameters?: object}}",
            )
    return tools


def _tool_choice(body: dict, tools: list | None) -> None:
    """``tool_choice`` as OpenAI takes it: none | auto; required and a named function, which would need a forced
    tool call, are refused with a 400 that says why (they were accepted and not enforced)."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto"):
        return
    forced = (
        "the proxy samples the policy as it is and cannot force a tool call (forcing one would train on tokens "
        "the policy did not choose): use 'auto', and reward the tool use you want"
    )
    if choice == "required":
        if not tools:
            raise ProxyError(400, "tool_choice: 'required' needs tools")
        raise ProxyError(400, f"tool_choice: 'required' is not supported: {forced}")
    names = [t["function"]["name"] for t in tools or ()]
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name in names:
            raise ProxyError(400, f"tool_choice: naming a function is not supported: {forced}")
        raise ProxyError(
            400, f"tool_choice names the function {str(name)[:60]!r}, which is not among the tools {names[:10]}"
        )
    raise ProxyError(400, "tool_choice must be 'none', 'auto', 'required' or {type: function, function: {name}}")


def _check_common(body: dict) -> None:
    """What every endpoint refuses: streaming (the proxy answers whole responses) and text that is not valid
    Unicode (a lone surrogate such as \\ud800, which JSON can carry and no tokenizer can encode)."""
    if body.get("stream"):
        raise ProxyError(
            400,
            "stream: streaming is not supported by the asyncrl proxy; set stream=false (the "
            "answer comes whole, recorded token for token)",
        )
    try:
        canonical(body).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ProxyError(
            400, f"the request holds text that is not valid Unicode ({e.reason} at character {e.start})"
        ) from None


def _check_chars(n: int, field: str, limit: int) -> None:
    if n > limit:
        raise ProxyError(413, f"{field}: {n} characters, more than {limit} (what the model's context can hold)")


def _list(body: dict, key: str) -> list | None:
    value = body.get(key)
    if value is not None and not isinstance(value, list):
        raise ProxyError(400, f"{key} must be a list")
    return value or None


def _n(body: dict) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if type(n) is not int or not 1 <= n <= 16:
        raise ProxyError(400, "n must be an integer from 1 to 16")
    return n


def _max_tokens(body: dict) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is not None:
            if type(value) is not int or value < 1:
                raise ProxyError(400, f"{key} must be a positive integer")
            return value
    return None


def _usage(prompt_ids: list[int], calls: list[Call]) -> dict:
    completion = sum(len(c.output_ids) for c in calls)
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(prompt_ids) + completion,
    }
