"""`python -m a2d_convert COMMAND ...`: one argparse subcommand per module.

Each command module exposes `add_parser(subparsers)`, which registers its subcommand and sets
`run=<function(args)>`. Command modules import torch inside their run functions, not at module
level, so that `--help` and torch-free commands (tiny-base) start fast. Bad input raises A2DError:
its one-line message goes to stderr and the exit status is 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys

from . import data, export, generate, golden, import_base, init_model, probes, quantize, tiny, train, verify
from .errors import A2DError

COMMANDS = [tiny, init_model, generate, golden, import_base, data, train, export, quantize, verify, probes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m a2d_convert", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except A2DError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
