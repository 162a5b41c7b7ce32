"""Row formats and prompt templates (asyncrl.data.formats): GSM8K, MATH, QA and code rows, field mappings, and templates
checked up front and applied to every source."""

import json

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig, dataset_from_config
from asyncrl.data.formats import detect_type, prompt_of, to_item
from asyncrl.reward import call_reward

from datasets_for_tests import ROWS, SAMPLES, build, take, write_jsonl


# ---- prompt templates and field mappings ----------------------------------------------------------------
@pytest.mark.parametrize(
    "template,match",
    [
        ("{question} Put it in \\boxed{}.", r"'\{\}' is a positional field: .* write \{\{\}\} for literal braces"),
        ("{0}: {question}", r"'\{0\}' is a positional field"),
        ("Solve it.", r"it names no field such as \{question\}, so every prompt would be the same text"),
        ("{question", "not a valid format string"),
        ("{question!x}", r"'\{question!x\}': the conversion must be !r, !s or !a"),
    ],
)
def test_bad_prompt_templates_are_refused_up_front(template, match):
    with pytest.raises(ConfigError, match=r"^train_dataset.prompt_template: " + match):
        TrainDatasetConfig(prompt_template=template).validate()
    with pytest.raises(ConfigError, match="train_dataset.prompt_template"):
        configlib.load(TrainConfig, None, [f"train_dataset.prompt_template='{template}'"])


def test_template_that_fails_on_every_item_is_a_config_error_not_a_traceback(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(ConfigError, match=r"(?s)no usable rows.*cannot be formatted \(AttributeError"):
        build(path, prompt_template="{question.nope}")
    with pytest.raises(ConfigError, match=r"(?s)no usable rows.*cannot be formatted \(TypeError"):
        build(path, prompt_template="{question} {answer[x]}")
    with pytest.raises(ConfigError, match=r"prompt_template cannot be formatted \(AttributeError.*task 'arith'"):
        build(prompt_template="{question.nope}")
    assert build(prompt_template="{question} ({answer!r:.0})").valid  # a valid conversion and spec work


def test_gsm8k_jsonl():
    data = build(f"{SAMPLES}/gsm8k_train.jsonl", f"{SAMPLES}/gsm8k_test.jsonl", valid_size=40)
    item = take(data.train, 1)[0]
    assert set(item) >= {"question", "answer", "solution", "id"} and item["answer"].lstrip("-").isdigit()
    assert "<<" not in item["solution"] and item["solution"].endswith(f"The answer is {item['answer']}.")
    assert len(data.valid) == 40 and data.reward_fn.__name__ == "math_reward"
    for it in data.valid[:5]:
        assert call_reward(data.reward_fn, it, it["solution"]) == 1.0


def test_math_format_takes_the_boxed_answer():
    data = build(f"{SAMPLES}/math_train.jsonl", f"{SAMPLES}/math_test.jsonl", type="math")
    it = data.valid[0]
    assert it["answer"] in it["solution"] and "\\boxed" not in it["answer"]
    assert it["level"].startswith("Level")  # other columns ride along for custom rewards
    assert all(call_reward(data.reward_fn, v, v["solution"]) == 1.0 for v in data.valid)


def test_code_format_and_reference_solutions_pass():
    data = build(f"{SAMPLES}/code_train.jsonl", f"{SAMPLES}/code_test.jsonl", valid_size=4)
    assert data.reward_fn.__name__ == "code_reward"
    kinds = {"fn_name" in it for it in data.valid}
    for it in data.valid:
        assert call_reward(data.reward_fn, it, it["solution"]) == 1.0, it["question"]
    assert kinds  # at least one style present; the train file has both
    train = take(data.train, 24)
    assert {("fn_name" in it) for it in train} == {True, False}


def test_field_mapping_and_prompt_template(tmp_path):
    path = write_jsonl(
        tmp_path / "qa.jsonl", [{"id": "r1", "q": f"What is {i} + {i}?", "final": 2 * i} for i in range(30)]
    )
    data = build(path, fields={"question": "q", "answer": "final"}, prompt_template="Solve: {question}")
    item = take(data.train, 1)[0]
    assert item["question"].startswith("Solve: What is") and item["answer"] == str(int(item["answer"]))
    assert item["source_id"] == "r1" and isinstance(item["id"], int)
    assert call_reward(data.reward_fn, item, f"The answer is {item['answer']}.") == 1.0


def test_prompt_template_applies_to_the_builtin_task():
    small = TaskConfig(min_terms=2, max_terms=2, max_operand=6)  # few distinct problems: collisions likely
    data = dataset_from_config(
        small, TrainDatasetConfig(prompt_template="Q: {question} Think step by step."), ValidDatasetConfig(size=20)
    )
    held = {it["question"] for it in data.valid}
    trained = {it["question"] for it in take(data.train, 300)}
    assert all(q.startswith("Q: Compute ") and q.endswith("step by step.") for q in held | trained)
    assert len(held) == 20 and not held & trained
    it = data.valid[0]
    assert call_reward(data.reward_fn, it, f"The answer is {it['answer']}.") == 1.0
    with pytest.raises(ConfigError, match=r"train_dataset.prompt_template.*'problem'"):
        dataset_from_config(small, TrainDatasetConfig(prompt_template="{problem}"), ValidDatasetConfig(size=5))


def test_a_mapped_column_reaches_the_reward_under_both_names():
    """fields={answer: n_vowels}: a reward written for the file (score(prompt, completion, n_vowels)) and one written
    for asyncrl (answer=) both get it; a mapped column that the row lacks is named."""
    from asyncrl.data.formats import to_item
    from asyncrl.reward.base import call_reward

    row = {"word": "tobarine", "q": "How many vowels in 'tobarine'?", "n_vowels": "4"}
    item = to_item(row, "qa", {"question": "q", "answer": "n_vowels"}, "")
    assert item["answer"] == item["n_vowels"] == "4" and item["question"] == row["q"] and item["word"] == "tobarine"
    assert call_reward(lambda prompt, completion, n_vowels, **_: float(completion == n_vowels), item, "4") == 1.0
    with pytest.raises(ValueError, match="fields.answer names the column 'n_vowls', which the row does not have"):
        to_item(row, "qa", {"question": "q", "answer": "n_vowls"}, "")
    from asyncrl.data.formats import detect_type

    # type auto: the format is detected from the first row, and a mapped column it lacks is named there too (it
    # said "cannot tell the row format" and told the user to map the column they had mapped: issue 44)
    with pytest.raises(ValueError, match=r"fields.question names the column 'opener'.*its columns: \['n_vowels', 'q'"):
        detect_type(row, {"question": "opener"})
    # the question's own column, and columns named like the reward's positional arguments, are not passed again
    row = {"prompt": "Sort: b a", "answer": "a b", "completion": "ignored"}
    item = to_item(row, "qa", {}, "")
    assert "prompt" not in item and "completion" not in item and item["question"] == "Sort: b a"
    assert call_reward(lambda prompt, completion, answer, **_: float(completion == answer), item, "a b") == 1.0
    assert "q" not in to_item({"q": "x?", "answer": "1"}, "qa", {"question": "q"}, "")


@pytest.mark.parametrize(
    "final, answer", [("1,234", "1234"), ("-12,345,678", "-12345678"), ("2,3", "2,3"), ("(2, 3)", "(2, 3)")]
)
def test_a_gsm8k_final_answer_loses_only_its_thousands_separators(final, answer):
    row = {"question": "Q?", "answer": f"work\n#### {final}"}
    assert to_item(row, detect_type(row, {}), {}, "")["answer"] == answer


def test_a_messages_column_of_a_qa_row_does_not_stand_for_its_prompt():
    """ultrachat-like rows (prompt, answer, messages) read as qa: the prompt is the templated question."""
    row = {
        "prompt": "What is 1 + 1?",
        "answer": "2",
        "messages": [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "x"}],
    }
    item = to_item(row, "qa", {}, "{question} Answer with a number.")
    assert prompt_of(item) == "What is 1 + 1? Answer with a number." and "messages" not in item


def test_a_first_line_that_is_no_object_does_not_decide_the_rows_format(tmp_path):
    """`null` first: skipped and counted; the MATH rows after it are still read as MATH (answers from \\boxed)."""
    from asyncrl.data.datasets import file_eval_set

    rows = [{"problem": f"What is {i}+1?", "solution": f"It is $\\\\boxed{{{i + 1}}}$."} for i in range(5)]
    path = tmp_path / "math.jsonl"
    path.write_text("null\n" + "".join(json.dumps(r) + "\n" for r in rows))
    items, _, _ = file_eval_set(str(path))
    assert [it["answer"] for it in items] == ["1", "2", "3", "4", "5"]


def test_common_exports_are_read_with_their_answers_and_tests():
    """NuminaMath-CoT rows (problem, solution, messages) are chat rows whose answer is the solution's boxed
    result (they had none: every RL reward failed); a MATH file whose first solution uses \\fbox is math, not qa;
    CodeContests' {"input": [...], "output": [...]} tests are read."""
    from asyncrl.data.formats import detect_type, to_item
    from asyncrl.reward.code_reward import parse_tests

    numina = {
        "problem": "What is 2+3?",
        "solution": "So it is $\\boxed{5}$.",
        "messages": [
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "So it is $\\boxed{5}$."},
        ],
    }
    assert to_item(numina, detect_type(numina, {}), {}, "")["answer"] == "5"
    fbox = {"problem": "What is 1+2?", "solution": "Thus \\fbox{3}."}
    assert detect_type(fbox, {}) == "math" and to_item(fbox, "math", {}, "")["answer"] == "3"
    cases = parse_tests({"input": ["1\n", "2\n"], "output": ["2\n", "3\n"]})
    assert [(c.stdin, c.stdout) for c in cases] == [("1\n", "2\n"), ("2\n", "3\n")]


def test_init_model_corpus_reads_content_parts_and_json_text_conversations():
    from asyncrl.data.tokenizer import row_texts

    parts = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is two plus two?"}]},
            {"role": "assistant", "content": "Four."},
        ]
    }
    assert row_texts(parts) == ["What is two plus two?", "Four."]
    assert row_texts({"messages": '[{"role": "user", "content": "hi"}]'}) == ["hi"]


def test_the_end_of_a_turn_comes_from_the_chat_template_not_the_eos():
    """A checkpoint whose eos is not the template's end of turn (Qwen2.5 base: eos <|endoftext|>, turns closed by
    <|im_end|>) was fine-tuned to end with eos and so never stopped where the template expects (issue 44): SFT
    targets end with the template's token, and generation stops at it (then at the eos too)."""
    import copy

    from asyncrl.commands.sft.examples import sft_example
    from asyncrl.data.formats import stop_ids, turn_end_id
    from asyncrl.models.hf import load_tokenizer

    shipped = load_tokenizer("builtin:tiny-sft")  # eos is <|im_end|>, the template's: nothing changes
    assert turn_end_id(shipped) == shipped.eos_token_id and stop_ids(shipped) == (shipped.eos_token_id,)
    base = copy.deepcopy(shipped)
    base.eos_token = "<|endoftext|>"
    im_end, endoftext = base.convert_tokens_to_ids("<|im_end|>"), base.convert_tokens_to_ids("<|endoftext|>")
    assert base.eos_token_id == endoftext != im_end
    assert turn_end_id(base) == im_end and stop_ids(base) == (im_end, endoftext)
    ids, prompt_len = sft_example(base, "Compute 2 + 3.", "The answer is 5.")
    assert ids[-1] == im_end and ids[prompt_len:-1] == base("The answer is 5.", add_special_tokens=False).input_ids
    plain = copy.deepcopy(shipped)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # no special token after a turn
    assert turn_end_id(plain) == plain.eos_token_id
