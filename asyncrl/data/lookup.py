"""The built-in agentic task ``lookup``: questions about made-up entities whose numbers only a tool knows.

A problem names a thing and one to three numbered boxes (``box 10`` to ``box 99``), e.g. ``How many apples do
box 41 and box 23 have together?``; the numbers are drawn per problem and kept in the item (``item["facts"]``:
``{"apples of box 41": 37, "apples of box 23": 15}``), so no model can know them: it has to call ``lookup`` once
per box, then combine the results (``37 + 15 = 52`` / ``The answer is 52.``; reward 1 if the final answer is
right). The tool answers with the box and its number (``box 41: 37``), so the working copies a number from a
labelled line. Some problems add or take away a number given in the question. The key of a fact is the box
(``box 41``; the full ``apples of box 41`` is accepted too, as is ``box 41's apples``): every fact of a problem
counts the same thing, and the reference transcripts name only the box, so a tiny model copies digits it knows
from arithmetic rather than a word it would have to learn to pick out of three phrasings.

Options (the ``task.*`` keys): ``min_terms``/``max_terms`` bound the numbers in a problem (every one a fact to
look up, or the last one given in the question), ``max_operand`` the largest number, ``ops`` the operators
(``+`` and ``-``), ``direct_frac`` the fraction of reference transcripts (used by SFT) that look nothing up and
state a made-up answer at once (``The answer is 57.``), ``direct_things`` the things whose questions get such
guesses (empty: every thing). A model fine-tuned on such a mixture guesses where its demonstrations did, as a
model does that believes it knows a fact; RL has to discover that looking up pays.

This module is the task: its problems, reference transcripts, verifier, tools' definitions, and the tiny agent
model's chat template and tokenizer. The environment (the tools themselves) and the episode that runs a problem
through an OpenAI client are :mod:`asyncrl.agent.tasks.lookup`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import ClassVar, Iterator

ANSWER_RE = re.compile(r"answer is\s*(-?\d+)")
OPS = "+-"

NAMES = tuple(f"box {n}" for n in range(10, 100))
"""90 entities, named by a two-digit number: a tiny model copies a number into its tool call with the skill it
has from arithmetic (its digit tokens come from the arithmetic checkpoint); made-up words were new tokens to it,
and a 4-layer model fine-tuned for 400 steps invented names instead of copying them (0 of 100 held-out solved).
Three-digit boxes (box 100 - box 999) were miscopied (box 634 called as box 644): two digits are less to copy."""
THINGS = ("apples", "coins", "books", "shells", "stamps", "marbles", "cards", "pens", "keys", "cups", "hats", "rings")

LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "The number stored under a key: a box, such as 'box 41'.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}
PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code; returns what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
TOOLS = [LOOKUP_TOOL, PYTHON_TOOL]


def tools(python: bool = True) -> list[dict]:
    """The tools an episode offers (the python tool optional)."""
    return [LOOKUP_TOOL, PYTHON_TOOL] if python else [LOOKUP_TOOL]


def tool_call_text(name: str, arguments: dict) -> str:
    """A tool call as the tiny agent model writes it (and its chat template renders it)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


# ---- problems ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LookupTask:
    """Generator of lookup problems (``problem``, ``stream``, ``split``, as :class:`asyncrl.data.arith.ArithTask`)."""

    min_terms: int = 2
    max_terms: int = 3
    max_operand: int = 99
    ops: str = "+-"
    direct_frac: float = 0.0
    direct_things: tuple[str, ...] = ()
    python_frac: float = 0.0
    episode: ClassVar[str] = "asyncrl.agent.tasks.lookup:episode"
    """The episode function that runs (and scores) a problem of this task."""
    tools: ClassVar[list[dict]] = TOOLS
    """The tools its episodes offer (the reference transcripts are rendered with them)."""

    def __post_init__(self):
        """A bad option raises ValueError; the message starts with the option's name."""
        if not self.ops or set(self.ops) - set(OPS):
            raise ValueError(f"ops of the lookup task must be made of '+' and '-', got {self.ops!r}")
        if self.min_terms < 1:
            raise ValueError(f"min_terms must be >= 1 for the lookup task, got {self.min_terms}")
        if self.max_terms < self.min_terms:
            raise ValueError(f"max_terms ({self.max_terms}) must be >= min_terms ({self.min_terms})")
        if self.max_terms > 6:
            raise ValueError(
                f"max_terms must be <= 6 for the lookup task (one tool call per fact), got {self.max_terms}"
            )
        if self.max_operand < 2:
            raise ValueError(f"max_operand must be >= 2, got {self.max_operand}")
        for name in ("direct_frac", "python_frac"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if isinstance(self.direct_things, str) or not all(isinstance(t, str) for t in self.direct_things):
            raise ValueError(f"direct_things must be a list of things, got {self.direct_things!r}")
        unknown = sorted(set(self.direct_things) - set(THINGS))
        if unknown:
            raise ValueError(
                f"direct_things names no thing of the lookup task: {unknown} (the things: {', '.join(THINGS)})"
            )
        if self.direct_things and not self.direct_frac:
            raise ValueError(
                "direct_things picks the questions that get guessing transcripts; with "
                "task.direct_frac 0 there are none: set task.direct_frac > 0 or leave direct_things empty"
            )
        object.__setattr__(self, "direct_things", tuple(self.direct_things))

    def problem(self, rng: random.Random) -> dict:
        n_terms = rng.randint(self.min_terms, self.max_terms)
        given = n_terms > 1 and rng.random() < 0.5  # the last number is given in the question
        n_facts = n_terms - given
        thing = rng.choice(THINGS)
        names = rng.sample(NAMES, n_facts)
        values = [rng.randint(2, self.max_operand)]
        ops = []
        for _ in range(n_terms - 1):
            op, total = rng.choice(self.ops), values_total(values, ops)
            if op == "-" and total < 1:  # every intermediate value stays >= 0
                op = "+"
            values.append(rng.randint(1, min(total, self.max_operand) if op == "-" else self.max_operand))
            ops.append(op)
        answer = values_total(values, ops)
        facts = {f"{thing} of {name}": v for name, v in zip(names, values)}
        question = _question(names, thing, ops, values[-1] if given else None)
        question = question[0].upper() + question[1:]
        item = {
            "question": question,
            "answer": str(answer),
            "facts": facts,
            "thing": thing,
            "names": names,
            "ops": "".join(ops),
            "given": values[-1] if given else None,
        }
        item["transcript"] = self.transcript(item)
        item["solution"] = item["transcript"][-1]["content"]
        return item

    def stream(self, seed: int) -> Iterator[dict]:
        """Endless training problems."""
        rng = random.Random(seed)
        while True:
            yield self.problem(rng)

    def split(self, seed: int, size: int) -> list[dict]:
        """A fixed list of ``size`` distinct problems (the held-out split)."""
        from asyncrl.data.arith import distinct_problems  # asyncrl.data imports this module

        return distinct_problems(self.problem, seed, size)

    # ---- reference transcripts (SFT) ---------------------------------------------------------------------
    def transcript(self, item: dict) -> list[dict]:
        """The reference conversation for ``item``: the user turn, then assistant turns (their ``content`` is
        the text the model writes, tool calls included) and tool results. Which kind is decided by the
        question's hash, so the problem streams do not depend on ``direct_frac``: a full one (every fact looked
        up by its box, then the working; ``python_frac`` of them compute with the python tool), or with
        ``direct_frac`` (for a thing of ``direct_things``, or any thing if it is empty) a guess: no lookup, a
        made-up answer."""
        question = item["question"]
        keys, values = list(item["facts"]), list(item["facts"].values())
        if item["given"] is not None:
            values.append(item["given"])
        ops = list(item["ops"])
        u = _unit_hash(question)
        messages = [{"role": "user", "content": question}]
        if u < self.direct_frac and (not self.direct_things or item["thing"] in self.direct_things):
            made_up, shown = random.Random(question + "#made-up"), []
            for i, v in enumerate(values):
                if i >= len(keys):  # a number given in the question
                    shown.append(v)
                elif i and ops[i - 1] == "-":  # the made-up total may still end below zero, as a guess can
                    shown.append(made_up.randint(1, max(1, min(values_total(shown, ops), self.max_operand))))
                else:
                    shown.append(made_up.randint(2, self.max_operand))
            messages.append({"role": "assistant", "content": f"The answer is {values_total(shown, ops)}."})
            return messages
        for name, value in zip(item["names"], values):
            messages += _lookup_turn(name, value)
        if len(values) > 1 and _unit_hash(question + "#python") < self.python_frac:
            code = "print(" + " ".join([str(values[0])] + [f"{op} {v}" for op, v in zip(ops, values[1:])]) + ")"
            messages += [
                {"role": "assistant", "content": tool_call_text("python", {"code": code})},
                {"role": "tool", "content": str(values_total(values, ops))},
                {"role": "assistant", "content": f"The answer is {values_total(values, ops)}."},
            ]
            return messages
        messages.append({"role": "assistant", "content": working(values, ops)})
        return messages


def tool_result(key: str, value: int) -> str:
    """What the lookup tool returns for the fact ``key`` (``apples of box 41``): its box and number, ``box 41: 37``."""
    return f"{key.split(' of ', 1)[-1]}: {value}"


def _lookup_turn(key: str, value: int) -> list[dict]:
    return [
        {"role": "assistant", "content": tool_call_text("lookup", {"key": key})},
        {"role": "tool", "content": tool_result(key, value)},
    ]


def values_total(values: list[int], ops: list[str]) -> int:
    total = values[0]
    for op, v in zip(ops, values[1:]):
        total = total + v if op == "+" else total - v
    return total


def working(values: list[int], ops: list[str]) -> str:
    """One operation per line, then ``The answer is N.`` (as the arithmetic task writes it)."""
    lines, total = [], values[0]
    for op, v in zip(ops, values[1:]):
        new = total + v if op == "+" else total - v
        lines.append(f"{total} {op} {v} = {new}")
        total = new
    return "\n".join(lines + [f"The answer is {total}."])


def _question(names: list[str], thing: str, ops: list[str], given: int | None) -> str:
    """The question in words: a few fixed phrasings for the common shapes, a step-by-step one otherwise."""
    if given is None:
        if len(names) == 1:
            return f"How many {thing} does {names[0]} have?"
        if all(op == "+" for op in ops):
            return f"How many {thing} do {_listed(names)} have together?"
        if ops == ["-"]:
            return f"How many more {thing} does {names[0]} have than {names[1]}?"
        if all(op == "-" for op in ops):
            return f"How many more {thing} does {names[0]} have than {_listed(names[1:])} together?"
    elif len(names) == 1:
        if ops == ["+"]:
            return f"{names[0]} has some {thing} and gets {given} more. How many {thing} does {names[0]} have now?"
        return f"{names[0]} has some {thing} and gives {given} away. How many {thing} does {names[0]} have left?"
    steps = [f"Start with the {thing} of {names[0]}"]
    for op, name in zip(ops, names[1:]):
        steps.append(f"{'add' if op == '+' else 'take away'} those of {name}")
    if given is not None:
        steps.append(f"{'add' if ops[-1] == '+' else 'take away'} {given}")
    return ", ".join(steps) + f". How many {thing} is that?"


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _unit_hash(text: str) -> float:
    """A deterministic number in [0, 1) for ``text``."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def extract_answer(text: str | None) -> str | None:
    """The integer after the last ``answer is`` in ``text``, or None."""
    found = ANSWER_RE.findall(text or "")
    return found[-1] if found else None


def lookup_reward(prompt: str, completion: str, answer: str, **_) -> float:
    """1.0 when the final answer in ``completion`` equals ``answer`` (the single-turn verifier: the agent's last
    reply scores the same way in :func:`episode`)."""
    got = extract_answer(completion)
    return 1.0 if got is not None and int(got) == int(answer) else 0.0


# ---- the tiny agent model's chat template and tokenizer ------------------------------------------------
CHAT_TEMPLATE = (
    "{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}"
    "{%- if tools or sys is not none -%}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if sys is not none %}{{ sys }}{% if tools %}{{ '\n' }}{% endif %}{% endif -%}"
    "{%- if tools %}{{ 'Tools:' }}"
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool -%}"
    "{{ '\n' + f.name + '(' }}"
    "{%- if f.parameters is defined and f.parameters.properties is defined -%}"
    "{{ f.parameters.properties | list | join(', ') }}{%- endif -%}"
    "{{ ')' }}{% if f.description is defined and f.description %}{{ ': ' + f.description }}{% endif %}"
    "{%- endfor %}{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' + (message.content or '') }}"
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    "{%- if not loop.first or message.content %}{{ '\n' }}{% endif -%}"
    "{{ '<tool_call>{\"name\": ' + (f.name | tojson) + ', \"arguments\": ' }}"
    "{%- if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif -%}"
    "{{ '}</tool_call>' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif -%}"
)
"""ChatML with tools in hermes style: a system turn listing the tools (``name(params): description``), assistant
tool calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (what the model writes), tool
results as ``<|im_start|>tool`` turns; assistant turns end with ``<|im_end|>`` (the eos token)."""

TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
"""Single tokens of the tiny agent tokenizer, not special: decoding keeps them, so the proxy's parser sees them."""


def tools_text(offered: list[dict]) -> str:
    """The tool list as :data:`CHAT_TEMPLATE` writes it in the system turn."""
    lines = ["Tools:"]
    for t in offered:
        f = t["function"]
        lines.append(f"{f['name']}({', '.join(f['parameters']['properties'])}): {f['description']}")
    return "\n".join(lines)


def tokenizer_corpus(task: LookupTask, n_problems: int = 20000, seed: int = 1234) -> list[str]:
    """Text the tiny agent tokenizer is trained on: the text between the special tokens of rendered reference
    transcripts of ``task`` (imperfect ones included), role names and the tool list included."""
    task = LookupTask(**{**task.__dict__, "direct_frac": max(task.direct_frac, 0.5)})
    rng = random.Random(seed)
    lines = []
    for _ in range(n_problems):
        item = task.problem(rng)
        lines.append("system\n" + tools_text(TOOLS))
        lines += [f"{m['role']}\n{m['content']}" for m in item["transcript"]]
    return lines


def build_agent_tokenizer(task: LookupTask | None = None, vocab_size: int = 1024, n_problems: int = 20000):
    """The tiny agent model's tokenizer: byte-level BPE (digits single tokens) trained on ``task``'s
    transcripts, ``<tool_call>``/``</tool_call>`` as single tokens, and :data:`CHAT_TEMPLATE`."""
    from asyncrl.data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(tokenizer_corpus(task or LookupTask(), n_problems), vocab_size=vocab_size)
    tokenizer.add_tokens(TOOL_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
