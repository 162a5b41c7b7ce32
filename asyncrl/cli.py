"""The ``asyncrl`` command: train | sft | eval | serve | report | init-model.

Every start-up refusal (a bad config value, a model directory that is not one, a missing extra) prints one
line naming the problem and the fix and exits with status 2; a run stopped by its own checks (the watchdog,
rollouts failing in a row) prints why and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from asyncrl import configlib
from asyncrl.configlib import ConfigError


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, with where to read on."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _config_parser(sub, name: str, help_: str):
    p = sub.add_parser(name, help=help_, description=help_)
    p.add_argument("--config", help="YAML file of overrides")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and doc")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied after --config")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="asyncrl", description="Fully asynchronous RL for LLM reasoning.")
    sub = parser.add_subparsers(dest="command", required=True)
    _config_parser(sub, "train", "RL training (GRPO + decoupled PPO, asynchronous)")
    _config_parser(sub, "sft", "supervised fine-tuning on the task's reference solutions")
    ev = _config_parser(sub, "eval", "held-out accuracy of a checkpoint")
    ev.add_argument("--model", help="checkpoint directory (same as model.path=...)")
    from asyncrl.report.cli import add_arguments as report_arguments
    from asyncrl.server.cli import add_arguments as serve_arguments

    serve_help = "serve a model over HTTP (SGLang-style and OpenAI-compatible APIs)"
    serve_arguments(sub.add_parser("serve", help=serve_help, description=serve_help))
    report_help = "render RUN_DIR/report.html (plots of a run directory)"
    report_arguments(sub.add_parser("report", help=report_help, description=report_help))
    init = sub.add_parser("init-model", help="build the tiny tokenizer and a randomly initialised model")
    init.add_argument("--out", default="outputs/tiny-init", help="output directory")
    init.add_argument("--task", choices=["arith", "lookup"], default="arith",
                      help="the task whose text the tokenizer is trained on: arith (the shipped tiny-sft) | lookup "
                           "(tool-use transcripts, <tool_call> tokens and a chat template with tools: examples/sft_agent.yaml)")
    init.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary (default 1024; 512 for lookup)")
    init.add_argument("--hidden-size", type=int, default=256)
    init.add_argument("--layers", type=int, default=4)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--init-from", default="", help="warm start: copy the weights of this checkpoint of the same "
                                                      "shape (e.g. builtin:tiny-sft), token rows by token string")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _quiet_loading()
    from asyncrl.checkpoint import CheckpointError
    from asyncrl.launch.signals import StopRequested
    from asyncrl.rollout import RolloutFailures
    from asyncrl.watchdog import TrainingHalted

    try:
        return _dispatch(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"asyncrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except StopRequested as e:
        print(f"asyncrl {args.command}: {e}; the run can go on: run the same command again", file=sys.stderr)
        return e.exit_code
    except (TrainingHalted, RolloutFailures, CheckpointError) as e:
        print(f"asyncrl {args.command}: stopped: {e}", file=sys.stderr)
        return 1


def _quiet_loading() -> None:
    """No per-tensor progress bars from transformers when a small checkpoint loads (they clutter the one
    line that a refusal prints)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def _dispatch(args) -> int:
    if args.command == "init-model":
        return _init_model(args)
    if args.command == "serve":
        from asyncrl.server.cli import run

        return run(args)
    if args.command == "report":
        from asyncrl.report.cli import run

        return run(args)
    from asyncrl.config import EvalConfig, SFTConfig, TrainConfig

    cls = {"train": TrainConfig, "sft": SFTConfig, "eval": EvalConfig}[args.command]
    if args.help_config:
        print(configlib.describe(cls))
        return 0
    overrides = list(args.overrides)
    if args.command == "eval" and args.model:
        overrides.insert(0, f"model.path={args.model}")
    cfg = configlib.load(cls, args.config, overrides)
    if args.command == "train":
        from asyncrl.controller import train

        record = train(cfg)
    elif args.command == "sft":
        from asyncrl.sft import sft

        record = sft(cfg)
    else:
        record = _eval(cfg)
    if record:  # trainer ranks other than 0 return nothing to show
        print(json.dumps({k: v for k, v in record.items() if not isinstance(v, (list, dict))}))
    return 0


def _eval(cfg) -> dict:
    import torch

    from asyncrl.data.config import eval_set_from_config
    from asyncrl.engine.local import LocalEngine
    from asyncrl.evaluate import evaluate
    from asyncrl.models import DTYPES, check_model_dir, load_model, load_tokenizer
    from asyncrl.reward import build_reward_service
    from asyncrl.types import SamplingParams

    torch.set_num_threads(cfg.threads)
    model_path = check_model_dir(cfg.model.path)
    tokenizer, model = load_tokenizer(model_path), load_model(model_path)
    max_len = min(model.config.max_position_embeddings, 1024)
    valid, default_fn = eval_set_from_config(cfg.task, cfg.valid_dataset, tokenizer=tokenizer,
                                             default_max_prompt_tokens=max_len - cfg.max_new_tokens)
    try:
        engine = LocalEngine(model, max_slots=64, max_len=max_len, dtype=DTYPES[cfg.model.dtype], seed=cfg.seed)
    except ValueError as e:  # a model shape the built-in engine does not run
        raise ConfigError(f"model.path: {e}") from e
    reward = build_reward_service(cfg.reward, default_fn)
    try:
        engine.start()
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, greedy=cfg.greedy,
                                temperature=cfg.temperature, stop_token_ids=(tokenizer.eos_token_id,))
        return {"model": cfg.model.path, "n": len(valid),
                **evaluate(engine, tokenizer, valid, reward.eval_fn, params)}
    finally:
        engine.stop()
        reward.close()


def _init_model(args) -> int:
    from asyncrl.models import build_tiny_model

    if args.task == "lookup":  # at 512 tokens a made-up name is an onset and a rhyme: few tokens to copy
        from asyncrl.agent.tasks.lookup import LookupTask, build_agent_tokenizer

        tokenizer = build_agent_tokenizer(LookupTask(), vocab_size=args.vocab_size or 512)
    else:
        from asyncrl.data.arith import ArithTask
        from asyncrl.data.tokenizer import build_tokenizer
        from asyncrl.models import tokenizer_corpus

        tokenizer = build_tokenizer(tokenizer_corpus(ArithTask()), vocab_size=args.vocab_size or 1024)
    model = build_tiny_model(tokenizer, hidden_size=args.hidden_size, num_layers=args.layers, seed=args.seed)
    shared = None
    if args.init_from:
        from asyncrl.agent.tasks.model import transplant
        from asyncrl.models import check_model_dir, load_model, load_tokenizer

        source = check_model_dir(args.init_from, "--init-from")
        try:
            shared = transplant(model, tokenizer, load_model(source), load_tokenizer(source))
        except ValueError as e:
            raise ConfigError(f"--init-from: {e}") from e
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"out": args.out, "params": n, "vocab": len(tokenizer),
                      **({"init_from": args.init_from, "shared_tokens": shared} if args.init_from else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
