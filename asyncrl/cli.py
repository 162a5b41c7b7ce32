"""The ``asyncrl`` command: train | sft | rm | eval | serve | report | diagnose | plan | compare | init-model
(``asyncrl.commands.eval`` holds eval, ``asyncrl.commands.rm`` rm).

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
from pathlib import Path

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


SUBCOMMANDS = {  # name: (help, the module with its add_arguments(parser) and run(args))
    "serve": ("serve a model over HTTP (SGLang-style and OpenAI-compatible APIs)", "asyncrl.server.cli"),
    "report": ("render RUN_DIR/report.html (plots of a run directory)", "asyncrl.report.cli"),
    "diagnose": (
        "where a run's time went and what to change (also on a run still running, or an SFT output)",
        "asyncrl.report.diagnose",
    ),
    "plan": (
        "predict a run before it starts: step time, tokens/s, waits, staleness (--sweep compares settings)",
        "asyncrl.launch.plan",
    ),
    "compare": (
        "which configuration wins on your task: N arms x S seeds of asyncrl train, a table, a winner only beyond noise",
        "asyncrl.commands.compare",
    ),
}
"""Subcommands whose flags live with their module."""

SUMMARY_KEYS = (
    "run_dir",
    "checkpoint",
    "complete",
    "step",
    "version",
    "elapsed_s",
    "reward_mean",
    "eval_accuracy",
    "staleness_max",
)
"""What `asyncrl train` prints last, as one JSON line for scripts (the lines before it say the same for people;
metrics.jsonl has every key of every step)."""

QUIET_LOGGERS = ("httpx", "httpcore")
"""Libraries that log every HTTP request at INFO (the agent proxy's clients, remote engines): WARNING and up."""


def _command_of(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def _module(name: str):
    import importlib

    return importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _Parser(prog="asyncrl", description="Fully asynchronous RL for LLM reasoning.")
    sub = parser.add_subparsers(dest="command", required=True)
    _config_parser(sub, "train", "RL training (GRPO + decoupled PPO, asynchronous)")
    _config_parser(sub, "sft", "supervised fine-tuning on the task's reference solutions")
    _config_parser(
        sub,
        "rm",
        "train a reward model (for reward.model) on preference pairs: JSONL rows of prompt, "
        "chosen, rejected (Bradley-Terry)",
    )
    ev = _config_parser(sub, "eval", "held-out pass@k and mean@n of a checkpoint")
    ev.description = (
        "held-out scores of a checkpoint: gconfig.n_samples answers per prompt, scored by reward.fn "
        "(or the data's own verifier); prints pass@k, mean@n and eval_accuracy (= pass@1) as one JSON "
        "line and writes every item's answers and rewards to `output` (JSONL). E.g. asyncrl eval "
        "--model DIR valid_dataset.path=test.jsonl gconfig.n_samples=8 evaluator.greedy=false k=[1,8]. "
        "--config also takes the file of an sft or train run (its data, reward and gconfig; --model "
        "names the checkpoint to evaluate)"
    )
    ev.add_argument(
        "--model",
        help="checkpoint directory, a run directory (RUN_DIR or RUN_DIR/checkpoints/latest: its "
        "latest checkpoint), a hub name in the local cache, or a LoRA adapter directory "
        "(adapter_config.json: its base model with the adapter merged); same as "
        "model.path=...",
    )
    command = _command_of(argv)
    for name, (help_, module) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:  # only the command being run imports its module (and so its dependencies)
            _module(module).add_arguments(p)
    init_help = (
        "build a byte-level BPE tokenizer (trained on a built-in task's text, or on your own --corpus) and "
        "a randomly initialised tiny Qwen2 model"
    )
    init = sub.add_parser("init-model", help=init_help, description=init_help)
    init.add_argument(
        "--out", default="outputs/tiny-init", help="output directory (new, empty, or an earlier init-model output)"
    )
    init.add_argument("--force", action="store_true", help="write into an --out that holds other files")
    text = init.add_mutually_exclusive_group()
    text.add_argument(
        "--task",
        choices=["arith", "lookup"],
        default=None,
        help="the built-in task whose text the tokenizer is trained on: arith (the shipped tiny-sft; "
        "the default) | lookup (tool-use transcripts, <tool_call> tokens and a chat template "
        "with tools: examples/sft_agent.yaml)",
    )
    text.add_argument(
        "--corpus",
        default="",
        metavar="FILE",
        help="train the tokenizer on your own text instead of a task's: a .txt file (one document "
        "per line) or a .jsonl/.json file of rows (every string field of a row, and the contents "
        "of chat 'messages'; --fields picks the columns), plus the chat template's words",
    )
    init.add_argument(
        "--fields",
        default="",
        metavar="A,B",
        help="the columns of a .jsonl/.json --corpus to read (default: every string field but 'id')",
    )
    init.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="most BPE tokens (default 1024; 512 for --task lookup); a small corpus may give fewer",
    )
    init.add_argument("--hidden-size", type=int, default=256, help="model width")
    init.add_argument("--layers", type=int, default=4, help="decoder layers")
    init.add_argument("--seed", type=int, default=0, help="seed of the random initialisation")
    init.add_argument(
        "--init-from",
        default="",
        help="warm start: copy the weights of this checkpoint of the same "
        "shape (e.g. builtin:tiny-sft), token rows by token string",
    )
    args = parser.parse_args(argv)
    if getattr(args, "help_config", False):
        print(config_help(args.command))
        return 0
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _quiet_loading()
    from asyncrl.api.weights import WeightSyncError
    from asyncrl.launch.ranks import RankDied
    from asyncrl.launch.signals import StopRequested
    from asyncrl.loop.buffer import BatchTimeout
    from asyncrl.loop.checkpoint import CheckpointError
    from asyncrl.loop.rollout import RolloutFailures
    from asyncrl.telemetry.metrics import RunFileError
    from asyncrl.telemetry.watchdog import TrainingHalted

    try:
        return _dispatch(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"asyncrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except StopRequested as e:
        print(f"asyncrl {args.command}: {e.advice()}", file=sys.stderr)
        return e.exit_code
    except (
        TrainingHalted,
        RolloutFailures,
        CheckpointError,
        WeightSyncError,
        BatchTimeout,
        RankDied,
        RunFileError,
    ) as e:
        print(f"asyncrl {args.command}: stopped: {e}", file=sys.stderr)
        return 1


def config_help(command: str) -> str:
    """``--help-config``'s text: every key of the command's config, its default and documentation. It depends
    only on asyncrl's source, so it is kept in asyncrl's cache directory under a digest of the source files: a
    later call prints it without importing the config tree (and with it torch)."""
    from asyncrl.cache import source_key, writable_dir, write_atomically

    folder = writable_dir("help-config")
    cached = folder / f"{command}-{source_key()}.txt" if folder else None
    if cached is not None and cached.is_file():
        return cached.read_text()
    text = configlib.describe(_config_classes()[command])
    if cached is not None:
        try:
            write_atomically(cached, text)
        except OSError:
            pass
    return text


def _config_classes() -> dict:
    """The config class of each command that takes one (imported only when needed: the tree imports torch)."""
    from asyncrl.config import EvalConfig, RMConfig, SFTConfig, TrainConfig

    return {"train": TrainConfig, "sft": SFTConfig, "eval": EvalConfig, "rm": RMConfig}


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
    if args.command in SUBCOMMANDS:
        return _module(SUBCOMMANDS[args.command][1]).run(args)
    classes = _config_classes()
    cls = classes[args.command]
    overrides = list(args.overrides)
    if args.command == "eval" and args.model:
        overrides.insert(0, f"model.path={args.model}")
    shared = ("train", "sft", "eval")  # one file (its shared sections) serves all three
    others = tuple(classes[n] for n in shared if classes[n] is not cls) if args.command in shared else ()
    cfg = configlib.load(cls, args.config, overrides, others)
    if args.command == "train":
        from asyncrl.launch.train import train

        record = train(cfg)
    elif args.command == "sft":
        from asyncrl.commands.sft.run import sft

        record = sft(cfg)
    elif args.command == "rm":
        from asyncrl.commands.rm import rm

        record = rm(cfg)
    else:
        from asyncrl.commands.eval import run_eval

        record = run_eval(cfg)
    if record:  # trainer ranks other than 0 return nothing to show
        keys = SUMMARY_KEYS if args.command == "train" else record
        print(json.dumps({k: record[k] for k in keys if k in record and not isinstance(record[k], (list, dict))}))
    return 0


def _check_shape(args) -> None:
    from asyncrl.data.tokenizer import SPECIAL_TOKENS

    least = 256 + len(SPECIAL_TOKENS)  # every byte, and the special tokens
    if args.vocab_size is not None and args.vocab_size < least:
        raise ConfigError(
            f"--vocab-size must be >= {least} (256 byte tokens and {len(SPECIAL_TOKENS)} special "
            f"tokens come first), got {args.vocab_size}"
        )
    if args.hidden_size < 8 or args.hidden_size % 8:  # 4 attention heads of an even size (rotary embeddings)
        raise ConfigError(f"--hidden-size must be a positive multiple of 8, got {args.hidden_size}")
    if args.layers < 1:
        raise ConfigError(f"--layers must be >= 1, got {args.layers}")


INIT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
"""What ``init-model`` writes: a directory holding only these is an earlier ``init-model`` output, written over."""


def _check_out(out: Path, force: bool) -> None:
    """Refuse an ``--out`` holding anything ``init-model`` did not write (a trained model's run files, a data
    directory): writing a random model there would lose the model, or mix the two. ``--force`` overwrites."""
    others = sorted(p.name for p in out.iterdir() if p.name not in INIT_FILES) if out.is_dir() else []
    if others and not force:
        raise ConfigError(
            f"--out {out} already holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''} "
            "(not an earlier init-model output): give an empty or new directory, or --force to write "
            "the new model's files over it"
        )


def _init_model(args) -> int:
    from asyncrl.models.hf import build_tiny_model

    _check_shape(args)
    _check_out(Path(args.out), args.force)
    if args.fields and not args.corpus:
        raise ConfigError("--fields picks the columns of a --corpus file of rows; there is no --corpus")
    if args.corpus:
        from asyncrl.data.tokenizer import build_tokenizer, read_corpus, with_template_words

        fields = [f.strip() for f in args.fields.split(",") if f.strip()]
        documents = read_corpus(args.corpus, "--corpus", fields or None)
        tokenizer = build_tokenizer(with_template_words(documents), vocab_size=args.vocab_size or 1024)
    elif args.task == "lookup":  # at 512 tokens a made-up name is an onset and a rhyme: few tokens to copy
        from asyncrl.data.lookup import LookupTask, build_agent_tokenizer

        tokenizer = build_agent_tokenizer(LookupTask(), vocab_size=args.vocab_size or 512)
    else:
        from asyncrl.data.arith import ArithTask
        from asyncrl.data.tokenizer import build_tokenizer
        from asyncrl.models.hf import tokenizer_corpus

        tokenizer = build_tokenizer(tokenizer_corpus(ArithTask()), vocab_size=args.vocab_size or 1024)
    model = build_tiny_model(tokenizer, hidden_size=args.hidden_size, num_layers=args.layers, seed=args.seed)
    shared = None
    if args.init_from:
        from asyncrl.agent.tasks.model import transplant
        from asyncrl.models.hf import check_model_dir, load_model, load_tokenizer

        source = check_model_dir(args.init_from, "--init-from")
        try:
            shared = transplant(model, tokenizer, load_model(source), load_tokenizer(source))
        except ValueError as e:
            raise ConfigError(f"--init-from: {e}") from e
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(
        json.dumps(
            {
                "out": args.out,
                "params": n,
                "vocab": len(tokenizer),
                **({"corpus": args.corpus, "documents": len(documents)} if args.corpus else {}),
                **({"init_from": args.init_from, "shared_tokens": shared} if args.init_from else {}),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
