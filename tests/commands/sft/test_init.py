"""SFT on the user's own data: prompt + response rows and chat rows read as `asyncrl train` reads them, the loss
on the response / assistant tokens only, packed rows giving the padded loss, bad rows named by file and line,
over-long examples skipped and counted, evaluation with a reward function by import path, step checkpoints
and the metrics file."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl import configlib
from asyncrl.config import SFTConfig
from asyncrl.configlib import ConfigError
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig, dataset_from_config
from asyncrl.data.formats import prompt_of
from asyncrl.trainer.packing import plan_micro_batches
from asyncrl.commands.sft import MICRO_BATCH_TOKENS, chat_example, item_example, micro_batch_losses, sft, sft_batch
from conftest import TESTS, make_model

TEMPLATES = TESTS / "data_fixtures" / "chat_templates"
PAIRS = [{"question": f"What is {a} plus {b}?", "response": f"{a}+{b}={a + b}. The answer is {a + b}.",
          "answer": str(a + b)} for a in range(2, 8) for b in range(3, 7)]  # 24 rows
CHATS = [{"messages": [{"role": "system", "content": "Answer with the sum."},
                       {"role": "user", "content": f"Add {a} and {b}."},
                       {"role": "assistant", "content": f"{a}+{b}={a + b}."},
                       {"role": "user", "content": f"And {a} and {b + 1}?"},
                       {"role": "assistant", "content": f"The answer is {a + b + 1}."}],
          "answer": str(a + b + 1)} for a in range(2, 7) for b in range(3, 7)]  # 20 rows


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def build(path, tokenizer, valid_size=2, **train):
    return dataset_from_config(TaskConfig(), TrainDatasetConfig(path=path, **train),
                               ValidDatasetConfig(size=valid_size), tokenizer=tokenizer)


def config(tmp_path, model_dir, *overrides) -> SFTConfig:
    return configlib.load(SFTConfig, None, [
        f"model.path={model_dir}", f"output_dir={tmp_path / 'out'}", "actor.threads=1", "train_dataset.batch_size=4",
        "actor.warmup_steps=1", "actor.lr=3e-3", "valid_dataset.size=2", "gconfig.max_new_tokens=8", *overrides])


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "sft_metrics.jsonl").read_text().splitlines()]


def spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of consecutive masked tokens."""
    out, run = [], []
    for t, m in zip(ids, mask):
        if m:
            run.append(t)
        elif run:
            out.append(run)
            run = []
    return out + ([run] if run else [])


# ---- prompt + response rows -----------------------------------------------------------------------------
def test_response_rows_mask_only_the_response(tmp_path, tokenizer):
    data = build(write_jsonl(tmp_path / "pairs.jsonl", PAIRS), tokenizer)
    item = next(data.train)
    assert item["solution"] == next(r["response"] for r in PAIRS if r["question"] == item["question"])
    (ids, n_prompt), untrained = item_example(tokenizer, item)
    assert untrained == 0 and ids[:n_prompt] == item["prompt_ids"]
    _, _, loss_mask = sft_batch([(ids, n_prompt)], tokenizer.pad_token_id)
    trained = [ids[t + 1] for t in range(len(ids) - 1) if loss_mask[0, t]]  # the tokens predicted under the mask
    assert trained == ids[n_prompt:] and trained[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(trained, skip_special_tokens=True) == item["solution"]


def test_qa_rows_without_a_solution_train_on_the_answer(tmp_path, tokenizer):
    rows = [{"question": f"Compute {i} + 1.", "answer": str(i + 1)} for i in range(10)]
    item = next(build(write_jsonl(tmp_path / "qa.jsonl", rows), tokenizer).train)
    (ids, n_prompt), _ = item_example(tokenizer, item)
    assert tokenizer.decode(ids[n_prompt:], skip_special_tokens=True) == item["answer"]


def test_prompt_response_pairs_need_no_answer(tmp_path, tokenizer):
    rows = [{"prompt": f"Say {i}.", "response": f"{i}"} for i in range(10)]
    data = build(write_jsonl(tmp_path / "pr.jsonl", rows), tokenizer)
    item = next(data.train)
    assert "answer" not in item and item["solution"] == item["question"][4:-1]
    (ids, n_prompt), _ = item_example(tokenizer, item)
    assert tokenizer.decode(ids[n_prompt:], skip_special_tokens=True) == item["solution"]


def test_sft_on_response_rows_lowers_the_loss_and_writes_metrics(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=12")
    record = sft(cfg)
    rows = metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all({"loss", "tokens", "elapsed_s"} <= set(r) and r["tokens"] > 0 for r in rows)
    assert "eval_accuracy" in rows[-1] and "eval_accuracy" not in rows[0] and record == rows[-1]
    assert sum(r["loss"] for r in rows[-3:]) / 3 < 0.7 * rows[0]["loss"]
    assert (Path(cfg.output_dir) / "config.json").exists() and (Path(cfg.output_dir) / "sft_config.yaml").exists()


# ---- chat rows ------------------------------------------------------------------------------------------
def test_chat_rows_become_items_with_their_prompt(tmp_path, tokenizer):
    data = build(write_jsonl(tmp_path / "chat.jsonl", CHATS), tokenizer)
    item = next(data.train)
    row = next(r for r in CHATS if r["messages"][3]["content"] == item["question"])
    assert item["messages"] == row["messages"] and item["answer"] == row["answer"]
    assert item["solution"] == row["messages"][-1]["content"]
    assert prompt_of(item) == row["messages"][:-1]
    assert data.reward_fn.__name__ == "math_reward"


def test_chat_rows_from_parquet(tmp_path, tokenizer):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    # Arrow gives every turn every key of any turn, as nulls
    rows = [{**r, "messages": [{**m, "tool_call_id": None} for m in r["messages"]]} for r in CHATS]
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    item = next(build(str(path), tokenizer).train)
    assert [m["role"] for m in item["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert all(set(m) == {"role", "content"} for m in item["messages"])
    (ids, mask), _ = item_example(tokenizer, item)
    assert [tokenizer.decode(r, skip_special_tokens=True) for r in spans(ids, mask)] == \
        [m["content"] for m in item["messages"] if m["role"] == "assistant"]


def test_chat_rows_in_sharegpt_form_and_templated(tmp_path, tokenizer):
    rows = [{"conversations": [{"from": "human", "value": f"Add {i} and 1."}, {"from": "gpt", "value": f"{i + 1}"}]}
            for i in range(10)]
    item = next(build(write_jsonl(tmp_path / "share.jsonl", rows), tokenizer,
                      prompt_template="{question} Be brief.").train)
    assert item["messages"][0]["role"] == "user" and item["messages"][1]["role"] == "assistant"
    assert item["question"].endswith(" Be brief.") and item["messages"][0]["content"] == item["question"]


@pytest.mark.parametrize("template", [None, "qwen2.5.jinja"])
def test_chat_mask_covers_exactly_the_assistant_turns(tmp_path, tokenizer, template):
    tok = _with_template(tokenizer, template)
    messages = CHATS[0]["messages"]
    ids, mask, untrained = chat_example(tok, messages)
    assert untrained == 0
    assert ids == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False).input_ids
    runs = spans(ids, mask)
    contents = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [tok.decode(r, skip_special_tokens=True) for r in runs] == contents
    assert all(r[-1] == tok.eos_token_id for r in runs)  # each turn ends with the token generation stops at
    content_tokens = sum(len(tok(c, add_special_tokens=False).input_ids) + 1 for c in contents)
    assert sum(mask) == content_tokens  # nothing of the system / user turns or the role headers
    text = tok.decode([t for t, m in zip(ids, mask) if not m], skip_special_tokens=True)
    assert all(m["content"] in text for m in messages if m["role"] != "assistant")


def test_an_assistant_turn_with_only_a_tool_call_is_trained(tokenizer):
    """OpenAI-format agent data: the turn that calls the tool has empty content; calling it is what is learnt."""
    tok = _with_template(tokenizer, "qwen2.5.jinja")
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "assistant", "content": "It is sunny."}]
    ids, mask, untrained = chat_example(tok, messages)
    runs = [tok.decode(r) for r in spans(ids, mask)]
    assert untrained == 0 and len(runs) == 2 and "<tool_call>" in runs[0] and "weather" in runs[0]
    assert runs[1].startswith("It is sunny.")


def test_an_assistant_turn_marked_weight_0_is_not_trained(tokenizer):
    """OpenAI's fine-tuning format marks assistant turns not to learn with "weight": 0 (it was dropped, and the
    turn trained)."""
    from asyncrl.data.formats import chat_messages

    tok = _with_template(tokenizer, "qwen2.5.jinja")
    messages = chat_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
                              {"role": "assistant", "content": "bad", "weight": 0}, {"role": "user", "content": "q2"},
                              {"role": "assistant", "content": "good", "weight": 1}])
    ids, mask, untrained = chat_example(tok, messages)
    assert untrained == 0 and [tok.decode(r, skip_special_tokens=True) for r in spans(ids, mask)] == ["good"]


def test_chat_turns_the_template_renders_differently_are_left_untrained(tokenizer):
    tok = _with_template(tokenizer, "qwen3.jinja")  # drops earlier turns' reasoning once a new query follows
    messages = [{"role": "user", "content": "Add 2 and 3."},
                {"role": "assistant", "content": "<think>\n2+3</think>\n\n5."},
                {"role": "user", "content": "And 2 and 4?"}, {"role": "assistant", "content": "6."}]
    ids, mask, untrained = chat_example(tok, messages)
    assert untrained == 1
    [run] = spans(ids, mask)
    assert tok.decode(run, skip_special_tokens=True).endswith("6.")


def _with_template(tokenizer, template):
    import copy

    tok = copy.deepcopy(tokenizer)
    if template:
        tok.chat_template = (TEMPLATES / template).read_text()
    return tok


def test_sft_on_chat_rows_evaluates_with_a_reward_fn_by_import_path(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=3",
                 "reward.fn=rewards_for_tests:always_one_reward")
    record = sft(cfg)
    assert record["eval_accuracy"] == 1.0 and record["eval_reward_errors"] == 0
    assert record["sft_turns_untrained"] == 0 and record["tokens"] > 0


# ---- packing --------------------------------------------------------------------------------------------
def test_packed_loss_and_gradients_equal_the_padded_ones():
    model = make_model(vocab=64, hidden=32).train()
    g = torch.Generator().manual_seed(0)
    examples = []
    for n in (30, 7, 12, 5, 22, 9, 3, 16):
        ids = torch.randint(1, 64, (n,), generator=g).tolist()
        examples.append((ids, max(1, n // 3)) if n % 2 else (ids, torch.randint(0, 2, (n,), generator=g).tolist()))
    batch = sft_batch(examples, pad_id=0)
    lengths = batch[1].sum(-1).tolist()
    assert any(len(row) > 1 for mb in plan_micro_batches(lengths, MICRO_BATCH_TOKENS) for row in mb)
    assert any(len(row) > 1 for mb in plan_micro_batches(lengths, 64) for row in mb)
    results = []
    for pack_rows, max_tokens in ((False, MICRO_BATCH_TOKENS), (True, MICRO_BATCH_TOKENS), (True, 64), (False, 64)):
        model.zero_grad()
        loss = sum(part.backward() or part.detach() for part in micro_batch_losses(
            model, *batch, pack_rows=pack_rows, max_tokens=max_tokens))
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((loss, grads))
    (loss0, grads0) = results[0]
    for loss, grads in results[1:]:
        assert torch.allclose(loss, loss0, atol=1e-5, rtol=0)
        assert torch.allclose(grads, grads0, atol=1e-5, rtol=1e-4)


# ---- errors, skips --------------------------------------------------------------------------------------
def test_bad_rows_are_named_by_file_and_line(tmp_path, tokenizer, caplog):
    rows = CHATS[:9] + [{"messages": [{"role": "user", "content": "hi"}]},  # line 10: no assistant turn
                        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                      {"role": "user", "content": "and?"}]},  # line 11: ends with a user turn
                        {"messages": [{"role": "robot", "content": "hi"}]}]  # line 12: unknown role
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="asyncrl.data"):
        data = build(path, tokenizer)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert f"{path}:10" in logged and "no assistant turn" in logged
    assert f"{path}:11" in logged and "follows the final assistant turn" in logged
    assert f"{path}:12" in logged and "role 'robot'" in logged
    assert data.stats()["data_bad_rows"] == 3
    with pytest.raises(ConfigError, match=f"{path}:10: .*no assistant turn"):
        build(path, tokenizer, skip_bad_rows=False)


def test_sft_errors_name_the_key_and_the_file(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="train_dataset.path: 'nope.jsonl' does not exist"):
        sft(config(tmp_path, tiny_model_dir, "train_dataset.path=nope.jsonl", "total_train_steps=1"))
    empty = write_jsonl(tmp_path / "empty.jsonl", ['{"question": "no target"}', "not json"])
    with pytest.raises(ConfigError, match=f"(?s)train_dataset.path: no usable rows in '{empty}'.*"
                                          f"{empty}:1: cannot tell.*{empty}:2: not valid JSON"):
        sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={empty}", "total_train_steps=1"))
    code_rows = [{"question": f"Print {i}.", "tests": [{"input": "", "output": f"{i}\n"}]} for i in range(12)]
    code = write_jsonl(tmp_path / "code.jsonl", code_rows)  # no solutions: nothing to train on
    with pytest.raises(ConfigError, match=f"train_dataset.path '{code}': no usable training example.*"
                                          "sft_skipped_no_target"):
        sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={code}", "total_train_steps=1"))


def test_examples_over_max_length_are_skipped_and_counted(tmp_path, tiny_model_dir, caplog):
    rows = PAIRS[:10] + [{"question": "Say it long.", "response": "1+1=2. " * 60, "answer": "2"}] * 4
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="asyncrl.commands.sft"):
        record = sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6",
                            "max_length=80", "evaluator.freq_steps=0"))
    assert record["sft_skipped_long"] >= 1
    warned = [r.getMessage() for r in caplog.records if "longer than max_length=80" in r.getMessage()]
    assert len(warned) == 1 and "sft_skipped_long" in warned[0]
    with pytest.raises(ConfigError, match="no usable training example.*sft_skipped_long.*raise max_length"):
        sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=1", "max_length=5"))


# ---- checkpoints ----------------------------------------------------------------------------------------
def test_save_every_writes_step_checkpoints_loadable_with_transformers(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=4", "saver.freq_steps=2")
    sft(cfg)
    out = Path(cfg.output_dir)
    assert sorted(p.name for p in out.glob("step*")) == ["step2", "step4"]
    step2 = AutoModelForCausalLM.from_pretrained(out / "step2")
    final = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out / "step2")
    assert any(not torch.equal(a, b) for a, b in zip(step2.state_dict().values(), final.state_dict().values()))
    step4 = AutoModelForCausalLM.from_pretrained(out / "step4")
    assert all(torch.equal(a, b) for a, b in zip(step4.state_dict().values(), final.state_dict().values()))


def test_the_best_held_out_model_is_kept_and_survives_a_resume(tmp_path, tiny_model_dir, monkeypatch):
    """OUTPUT/best is the model of the best evaluation so far (best.json: step and accuracy), loadable; a resumed
    run keeps a best saved before its resume point and replaces one saved at steps it trains again."""
    import asyncrl.commands.sft as sft_module
    from transformers import AutoModelForCausalLM

    accuracies = iter([0.2, 0.6, 0.4, 0.5, 0.3, 0.7])

    def scored(self, model):
        return {"eval_accuracy": next(accuracies)}

    monkeypatch.setattr(sft_module._Scorer, "__call__", scored)
    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=4", "saver.freq_steps=2",
                 "evaluator.freq_steps=1")
    sft(cfg)  # evaluations 0.2, 0.6, 0.4, 0.5 at steps 1-4
    best = Path(cfg.output_dir) / "best"
    assert json.loads((best / "best.json").read_text()) == {"step": 2, "eval_accuracy": 0.6, "evaluation": {
        "greedy": True, "success_threshold": 1.0}}
    step2 = AutoModelForCausalLM.from_pretrained(Path(cfg.output_dir) / "step2").state_dict()
    assert all(torch.equal(a, b) for a, b in zip(AutoModelForCausalLM.from_pretrained(best).state_dict().values(),
                                                 step2.values()))
    sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6", "saver.freq_steps=2",
               "evaluator.freq_steps=1"))  # resumes at step 5: 0.3, then 0.7 at step 6
    assert json.loads((best / "best.json").read_text())["eval_accuracy"] == 0.7
    (best / "best.json").write_text(json.dumps({"step": 5, "eval_accuracy": 0.9}))  # as if saved after step 4
    accuracies = iter([0.1, 0.05])
    sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6", "saver.freq_steps=2",
               "evaluator.freq_steps=1"))  # resumes from step6: nothing to train, the best stays
    assert json.loads((best / "best.json").read_text())["step"] == 5
    (Path(cfg.output_dir) / "step6" / "sft_state.pt").unlink()  # now it resumes at step 5, which it trains again
    sft(config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6", "saver.freq_steps=2",
               "evaluator.freq_steps=1"))
    assert {k: v for k, v in json.loads((best / "best.json").read_text()).items() if k != "evaluation"} == {
        "step": 5, "eval_accuracy": 0.1}


def test_a_best_model_evaluated_under_other_settings_is_not_compared(tmp_path, caplog):
    """A resumed run may change evaluator.greedy or evaluator.success_threshold: the best accuracy measured
    under the old ones is not a bar for the new ones (the next evaluation replaces it); under the same ones it is."""
    from asyncrl.commands.sft.state import best_before

    best = tmp_path / "best"
    best.mkdir()
    (best / "best.json").write_text(json.dumps({"step": 4, "eval_accuracy": 0.9, "evaluation": {
        "greedy": True, "success_threshold": 1.0}}))
    assert best_before(tmp_path, 5, {"greedy": True, "success_threshold": 1.0})["eval_accuracy"] == 0.9
    assert best_before(tmp_path, 5, {"greedy": False, "success_threshold": 1.0}) is None
    assert best.is_dir() and "is not compared, and the next evaluation replaces it" in caplog.text


def test_a_stopped_sft_run_resumes_from_its_step_checkpoint_with_the_same_losses(tmp_path, tiny_model_dir,
                                                                                   monkeypatch, caplog):
    """Stopped after step 4 (saved at 2 and 4), the same command continues at step 5 from the weights, optimizer,
    data position and RNG of step 4: every loss equals the uninterrupted run's, each step is logged once."""
    import asyncrl.commands.sft as sft_module

    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    whole = config(tmp_path / "whole", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6",
                   "saver.freq_steps=2")
    sft(whole)
    cut = config(tmp_path / "cut", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=6",
                 "saver.freq_steps=2")
    real_batch, calls = sft_module.sft_batch, []

    def stop_at_step_5(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_batch(*args)

    monkeypatch.setattr(sft_module, "sft_batch", stop_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        sft(cut)
    monkeypatch.setattr(sft_module, "sft_batch", real_batch)
    (Path(cut.output_dir) / "step2" / "sft_state.pt").unlink()  # the newest step checkpoint is the one used
    assert [r["step"] for r in metrics(cut.output_dir)] == [1, 2, 3, 4]
    with caplog.at_level(logging.INFO, logger="asyncrl.commands.sft"):
        sft(cut)
    assert any("resuming from" in r.message and "step4" in r.message for r in caplog.records)
    resumed, uninterrupted = metrics(cut.output_dir), metrics(whole.output_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in uninterrupted]
    assert resumed[-1]["elapsed_s"] >= resumed[3]["elapsed_s"]
    with pytest.raises(ConfigError, match=r"another configuration \(actor.lr: 0.003 -> 0.001\).*resume=fresh"):
        sft(config(tmp_path / "cut", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=8",
                   "saver.freq_steps=2", "actor.lr=1e-3"))
    fresh = config(tmp_path / "cut", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=2",
                   "resume=fresh")
    sft(fresh)
    assert [r["step"] for r in metrics(fresh.output_dir)] == [1, 2]
    # the run started over holds none of the earlier run's step checkpoints (moved aside with it): the same
    # command again (resume=auto) does not continue the earlier run's step 6 under the new run's name
    assert not list(Path(fresh.output_dir).glob("step*"))
    assert [p.name.split(".replaced-")[0] for p in (tmp_path / "cut").glob("out.replaced-*")] == ["out"]
    again = config(tmp_path / "cut", tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=2")
    sft(again)
    assert [r["step"] for r in metrics(again.output_dir)] == [1, 2]


def test_the_progress_bar_shows_on_a_terminal_only(monkeypatch):
    from asyncrl.commands.sft import _progress_bar

    cfg = configlib.load(SFTConfig, None, ["total_train_steps=10"])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert _progress_bar(cfg, 0) is None  # a file or a pipe: log lines only
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = _progress_bar(cfg, 4)  # a resumed run starts the bar where it stopped
    assert (bar.n, bar.total) == (4, 10)
    bar.close()
    assert _progress_bar(configlib.load(SFTConfig, None, ["progress_bar=false"]), 0) is None


def test_lora_sft_trains_the_adapters_and_saves_them_with_a_merged_model(tmp_path, tiny_model_dir):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    path = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    cfg = config(tmp_path, tiny_model_dir, f"train_dataset.path={path}", "total_train_steps=4", "saver.freq_steps=2",
                 "evaluator.freq_steps=2", "model.lora.rank=4", "actor.lr=1e-2")
    sft(cfg)
    out = Path(cfg.output_dir)
    rows = metrics(out)
    assert "eval_accuracy" in rows[1] and "eval_accuracy" in rows[3]
    for d in (out, out / "step2", out / "step4"):
        assert (d / "adapter_config.json").exists() and (d / "adapter_model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").state_dict()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all("proj" in k for k in changed)  # only the adapted layers moved


# ---- the command ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_asyncrl_sft_command_on_a_jsonl(tmp_path, tiny_model_dir):
    exe = Path(sys.executable).parent / "asyncrl"
    if not exe.exists():
        pytest.skip("the asyncrl entry point is not installed beside this interpreter (pip install -e .)")
    train = write_jsonl(tmp_path / "train.jsonl", PAIRS)
    valid = write_jsonl(tmp_path / "valid.jsonl", PAIRS[:3])
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([str(exe), "sft", f"model.path={tiny_model_dir}", f"train_dataset.path={train}",
                           f"valid_dataset.path={valid}", f"output_dir={out}", "total_train_steps=3",
                           "train_dataset.batch_size=4", "actor.threads=1", "evaluator.freq_steps=2",
                           "gconfig.max_new_tokens=8"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and "eval_accuracy" in rows[1] and "eval_accuracy" in rows[2]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 3
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()


def test_warmup_that_outlasts_the_run_is_warned(caplog):
    import logging

    from asyncrl import configlib
    from asyncrl.config import SFTConfig

    with caplog.at_level(logging.WARNING):
        configlib.load(SFTConfig, None, ["total_train_steps=40", "actor.warmup_steps=50"])
    assert any("actor.warmup_steps=50 is above total_train_steps=40" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # step 40 of a 40-step warm-up is at actor.lr: nothing to say
        configlib.load(SFTConfig, None, ["total_train_steps=40", "actor.warmup_steps=40"])
    assert not any("warmup_steps" in r.message for r in caplog.records)
    with pytest.raises(configlib.ConfigError, match="log_every"):
        configlib.load(SFTConfig, None, ["log_every=0"])


def test_sft_and_eval_take_trains_key_names_and_still_read_their_old_ones(tmp_path, caplog):
    """One vocabulary: total_train_steps, train_dataset.batch_size, actor.lr, output_dir, gconfig.max_new_tokens,
    evaluator.freq_steps in sft; gconfig.n_samples, evaluator.greedy in eval. The old spellings still work for one
    release, each with a deprecation line naming the new key; a train file's shared sections load in both."""
    import logging

    from asyncrl import configlib
    from asyncrl.config import EvalConfig, SFTConfig, TrainConfig

    with caplog.at_level(logging.WARNING):
        old = configlib.load(SFTConfig, None, ["steps=7", "batch_size=3", "lr=0.01", "output=o", "eval_every=2",
                                               "max_new_tokens=9", "save_every=1", "threads=1", "warmup_steps=1"])
    new = configlib.load(SFTConfig, None, ["total_train_steps=7", "train_dataset.batch_size=3", "actor.lr=0.01",
                                           "output_dir=o", "evaluator.freq_steps=2", "gconfig.max_new_tokens=9",
                                           "saver.freq_steps=1", "actor.threads=1", "actor.warmup_steps=1"])
    assert configlib.to_dict(old) == configlib.to_dict(new)
    said = " ".join(r.message for r in caplog.records)
    assert "'steps' is deprecated: use 'total_train_steps'" in said and "'lr' is deprecated: use 'actor.lr'" in said
    ev = configlib.load(EvalConfig, None, ["n_samples=4", "greedy=false", "max_new_tokens=5", "temperature=0.5"])
    assert (ev.gconfig.n_samples, ev.evaluator.greedy, ev.gconfig.max_new_tokens, ev.gconfig.temperature) == \
        (4, False, 5, 0.5)
    task = tmp_path / "train.yaml"  # a train file: its RL-only keys are left out by sft and eval
    task.write_text("total_train_steps: 5\nrollout:\n  max_head_offpolicyness: 4\ntrain_dataset:\n  batch_size: 8\n"
                    "gconfig:\n  max_new_tokens: 12\n")
    others = (TrainConfig, SFTConfig, EvalConfig)
    ev = configlib.load(EvalConfig, str(task), [], others)
    assert ev.gconfig.max_new_tokens == 12 and ev.train_dataset.batch_size == 8
    sft_cfg = configlib.load(SFTConfig, str(task), [], others)
    assert sft_cfg.total_train_steps == 5 and sft_cfg.gconfig.max_new_tokens == 12
    with pytest.raises(configlib.ConfigError, match="unknown config key 'bogus'"):
        (tmp_path / "bad.yaml").write_text("bogus: 1\n")
        configlib.load(EvalConfig, str(tmp_path / "bad.yaml"), [], others)


def test_starting_over_refuses_to_move_the_model_it_trains_from(tmp_path, monkeypatch):
    """resume=fresh moves an earlier run aside: not when model.path is in it (out, out/best, out/stepN), which
    would be moved away from under the run (found after training, as a failure to load model.path); and
    output_dir=. works (it has no name of its own)."""
    from asyncrl.commands.sft.state import start_over

    out = tmp_path / "out"
    (out / "step2").mkdir(parents=True)
    (out / "step2" / "sft_state.pt").write_bytes(b"")
    (out / "best").mkdir()
    for model in (str(out), str(out / "best"), str(out / "step2")):
        with pytest.raises(ConfigError, match="is inside output_dir .* write this run to another output_dir"):
            start_over(out, model)
    assert (out / "step2").is_dir()
    monkeypatch.chdir(out)
    start_over(Path("."), "Qwen/Qwen2.5-0.5B-Instruct")  # a hub name is no directory of out's
    assert not (out / "step2").exists() and len(list(tmp_path.glob("out.replaced-*/step2"))) == 1
    assert Path.cwd() == out.resolve()  # the new run writes where the working directory is
