"""The `dit` command.

Each stage of the chain owns its subcommands: a module listed in `COMMAND_MODULES` exposes
`add_commands(subparsers)`, which adds parsers whose `func(args) -> int` runs the command.
Modules are imported only when `dit` runs, so a missing optional dependency of one stage
(diffusers, say) does not break the others.
"""

import argparse
import importlib
import sys

from dit_trainer.errors import DitError

COMMAND_MODULES = (
    "dit_trainer.train.cli",  # dit train
    "dit_trainer.sample",  # dit sample
    "dit_trainer.sample.ddp",  # dit sample-ddp
    "dit_trainer.demo",  # dit demo
    "dit_trainer.data.cli",  # dit extract, dit data convert|verify
    "dit_trainer.evaluate.cli",  # dit eval
    "dit_trainer.convert",  # dit convert
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="dit", description="Train and sample Diffusion Transformers.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv=None) -> int:
    """Entry point of the `dit` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Only `dit train` takes free-form `--section.field value` overrides; elsewhere they are typos.
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        return int(args.func(args) or 0)
    except DitError as err:
        print(f"dit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
