"""``python -m asyncrl.server --model DIR --port N [...]``: ``asyncrl serve`` without the main CLI (what
``asyncrl.engine.spawn.asyncrl_server`` starts)."""

import argparse
import sys

from asyncrl.server.cli import PROG, add_arguments, refuse, run


class _OneLineParser(argparse.ArgumentParser):
    """Flag errors as one line, like every other refusal to start."""

    def error(self, message: str):
        sys.exit(refuse(f"{message} (see --help)"))


def main(argv: list[str]) -> int:
    parser = _OneLineParser(prog=PROG, description="Serve a model over HTTP (SGLang-style and OpenAI APIs).")
    add_arguments(parser)
    return run(parser.parse_args(argv[1:] if argv[:1] == ["--"] else argv))


sys.exit(main(sys.argv[1:]))
