"""Tool-call parsers (asyncrl.agent.tools): Hermes ``<tool_call>`` blocks and Llama 3 JSON calls; malformed calls
are counted and stay in the content; parsing changes only the message returned to the agent, never a token."""

import asyncio
import json

import pytest

from asyncrl.agent.chat import ChatRenderer
from asyncrl.agent.proxy import AgentProxy
from asyncrl.agent.tools import PARSERS, Reply, parse_hermes, parse_llama3_json, parse_none
from asyncrl.types import Completion, SamplingParams


def _block(obj, newlines=True) -> str:
    body = obj if isinstance(obj, str) else json.dumps(obj)
    return f"<tool_call>\n{body}\n</tool_call>" if newlines else f"<tool_call>{body}</tool_call>"


def _calls(reply) -> list[tuple[str, dict]]:
    out = []
    for c in reply.tool_calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        assert isinstance(c["function"]["arguments"], str)  # OpenAI format: arguments as a JSON string
        out.append((c["function"]["name"], json.loads(c["function"]["arguments"])))
    return out


# ---- hermes ------------------------------------------------------------------------------------------------
def test_hermes_one_call():
    reply = parse_hermes(_block({"name": "lookup", "arguments": {"key": "a"}}))
    assert _calls(reply) == [("lookup", {"key": "a"})] and reply.content == "" and reply.malformed == 0


def test_hermes_several_calls_get_distinct_ids():
    text = (
        _block({"name": "lookup", "arguments": {"key": "a"}})
        + "\n"
        + _block({"name": "add", "arguments": {"x": 1, "y": [2, 3]}}, newlines=False)
    )
    reply = parse_hermes(text)
    assert _calls(reply) == [("lookup", {"key": "a"}), ("add", {"x": 1, "y": [2, 3]})]
    assert reply.content == "" and reply.malformed == 0
    assert len({c["id"] for c in reply.tool_calls}) == 2


def test_hermes_keeps_the_content_around_calls():
    text = (
        "<think>\nI need a.\n</think>\n\nLet me check.\n"
        + _block({"name": "lookup", "arguments": {"key": "a"}})
        + "\nThen I add."
    )
    reply = parse_hermes(text)
    assert _calls(reply) == [("lookup", {"key": "a"})]
    assert reply.content == "<think>\nI need a.\n</think>\n\nLet me check.\n\nThen I add."


def test_hermes_without_calls_leaves_the_text_as_it_is():
    for text in ["The answer is 42.", "  spaced \n", "", "a <tool_call mention without a block"]:
        assert parse_hermes(text) == Reply(text, [], 0)


def test_hermes_arguments_as_a_json_string_and_missing_arguments():
    text = (
        _block({"name": "lookup", "arguments": json.dumps({"key": "a"})})
        + _block({"name": "now"})
        + _block({"name": "lookup", "parameters": {"key": "b"}})
    )
    reply = parse_hermes(text)
    assert _calls(reply) == [("lookup", {"key": "a"}), ("now", {}), ("lookup", {"key": "b"})]
    assert reply.malformed == 0


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "lookup", "arguments": {"key": }',  # not JSON
        '{"arguments": {"key": "a"}}',  # no name
        '{"name": "", "arguments": {}}',  # empty name
        '{"name": 3, "arguments": {}}',  # name not a string
        '{"name": "lookup", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "lookup", "arguments": "not json"}',  # arguments a string that is not JSON
        '{"name": "lookup", "arguments": "[1]"}',  # arguments a JSON string of a non-object
        '{"name": "lookup", "arguments": null}',
        '["lookup", {"key": "a"}]',  # not an object
    ],
)
def test_hermes_malformed_calls_are_counted_and_stay_in_the_content(body):
    good = _block({"name": "lookup", "arguments": {"key": "a"}})
    bad = _block(body)
    reply = parse_hermes("Checking.\n" + bad + "\n" + good)
    assert _calls(reply) == [("lookup", {"key": "a"})]
    assert reply.malformed == 1
    assert reply.content == "Checking.\n" + bad  # what the model wrote, for the agent to see


def test_hermes_unclosed_call_is_counted_and_stays_in_the_content():
    cut = '<tool_call>\n{"name": "lookup", "argu'  # a reply cut at the length limit
    reply = parse_hermes(cut)
    assert reply.tool_calls == [] and reply.malformed == 1 and reply.content == cut
    good = _block({"name": "lookup", "arguments": {"key": "a"}})
    reply = parse_hermes(good + "\n" + cut)
    assert _calls(reply) == [("lookup", {"key": "a"})] and reply.malformed == 1 and reply.content == cut


# ---- llama3_json -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["", "<|python_tag|>", "  <|python_tag|> "])
def test_llama3_json_call_with_and_without_python_tag(prefix):
    reply = parse_llama3_json(prefix + '{"name": "lookup", "parameters": {"key": "a"}}\n')
    assert _calls(reply) == [("lookup", {"key": "a"})] and reply.content == "" and reply.malformed == 0


def test_llama3_json_arguments_key_as_a_json_string_and_missing():
    assert _calls(parse_llama3_json('{"name": "f", "parameters": "{\\"x\\": 1}"}')) == [("f", {"x": 1})]
    assert _calls(parse_llama3_json('{"name": "f", "arguments": {"x": 1}}')) == [("f", {"x": 1})]  # not dropped
    assert _calls(parse_llama3_json('{"name": "f"}')) == [("f", {})]


def test_llama3_json_plain_text_is_content():
    for text in ["The answer is 42.", 'Use {"name": ...} to call.', ""]:
        reply = parse_llama3_json(text)
        assert (reply.content, reply.tool_calls, reply.malformed) == (text, [], 0)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "lookup", "parameters": {"key": }',  # not JSON
        '<|python_tag|>{"parameters": {"key": "a"}}',  # no name
        '{"name": "lookup", "parameters": [1]}',  # arguments not an object
        '{"name": "lookup", "parameters": {"key": "a"}} and some text',  # not one JSON object
        '{"name": "lookup", "parameters": {"key": "a"}',  # cut at the length limit
    ],
)
def test_llama3_json_malformed_is_counted_and_kept(text):
    reply = parse_llama3_json(text)
    assert (reply.content, reply.tool_calls, reply.malformed) == (text, [], 1)


def test_none_parser_and_registry():
    text = _block({"name": "lookup", "arguments": {"key": "a"}})
    assert (parse_none(text).content, parse_none(text).tool_calls) == (text, [])
    assert set(PARSERS) == {"hermes", "llama3_json", "none"}


# ---- parsing changes only the message: the recorded ids are the engine's -----------------------------------
TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}},
    }
]


class Engine:
    def __init__(self, tokenizer, texts):
        self.outputs = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
        self.received = []

    async def generate(self, prompt_ids, params):
        ids = self.outputs[len(self.received)]
        self.received.append(list(prompt_ids))
        return [Completion(list(prompt_ids), ids, [-1.0] * len(ids), [0] * len(ids), "stop")]


def test_parsing_touches_no_token(tokenizer):
    """A reply with a good call, a malformed one and text around them: the agent gets a cleaned message, but the
    next prompt continues the engine's own ids (the tiny ChatML template could not even re-render tool calls)."""
    good = _block({"name": "lookup", "arguments": {"key": "a"}}, newlines=False)
    bad = _block('{"name": "lookup", "arguments": {"key": }', newlines=False)
    first = "Let me look. " + good + bad
    engine = Engine(tokenizer, [first, "It is 1."])
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(tokenizer.eos_token_id,))
    proxy = AgentProxy(ChatRenderer(tokenizer, tokenizer.eos_token_id), params, 4096, engine=engine)
    key = proxy.open()

    async def agent():
        messages = [{"role": "user", "content": "What is a?"}]
        reply = await proxy.chat(key, {"messages": messages, "tools": TOOLS})
        message = reply["choices"][0]["message"]
        assert message["content"] == "Let me look. " + bad and len(message["tool_calls"]) == 1
        assert reply["choices"][0]["finish_reason"] == "tool_calls"
        call = message["tool_calls"][0]
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "1"}]
        await proxy.chat(key, {"messages": messages, "tools": TOOLS})

    asyncio.run(agent())
    assert proxy.tool_parse_errors == 1
    first = engine.received[0] + engine.outputs[0]
    assert engine.received[1][: len(first)] == first
    assert good in tokenizer.decode(engine.received[1])  # the call as the model wrote it, not as parsed
    episode = proxy.close(key)
    assert episode.history_edits == 0
    assert [s.output_ids for s in episode.samples(1.0)] == engine.outputs
    assert [s.prompt_ids for s in episode.samples(1.0)] == engine.received


def test_hermes_arguments_with_nan_or_infinity_are_malformed():
    """Python's json reads NaN and Infinity; a strict client (JS, Go, pydantic) cannot, so the call is counted.
    So are 1e400 (inf once read, written back as Infinity) and an integer too long to read (it raised out of the
    proxy: the agent's request failed instead of counting a malformed call)."""
    for bad in (
        '{"name": "f", "arguments": {"x": NaN}}',
        '{"name": "f", "arguments": "{\\"x\\": Infinity}"}',
        '{"name": "f", "arguments": {"x": 1e400}}',
        '{"name": "f", "arguments": {"x": -1e400}}',
        '{"name": "f", "arguments": {"x": %s}}' % ("9" * 5000),
        "[" * 100_000 + "]" * 100_000,
    ):
        reply = parse_hermes(f"<tool_call>{bad}</tool_call>")
        assert reply.tool_calls == [] and reply.malformed == 1
        assert parse_llama3_json(bad).malformed == (1 if bad.startswith("{") else 0)
    ok = parse_hermes('<tool_call>{"name": "f", "arguments": {"x": 1e300, "y": 12}}</tool_call>')
    assert ok.malformed == 0 and ok.tool_calls[0]["function"]["arguments"] == '{"x": 1e+300, "y": 12}'
