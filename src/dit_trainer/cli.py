"""The `dit` command.

Each stage of the chain owns its subcommands: a module listed in `COMMAND_MODULES` exposes
`add_commands(subparsers)`, which adds parsers whose `func(args) -> int` runs the command.
Registering must stay light (no torch at import: `dit --help` answers at once); each command
imports what it needs when it runs, so a missing optional dependency of one stage (diffusers,
say) does not break the others.
"""

import argparse
import gc
import importlib
import sys

from dit_trainer import __version__
from dit_trainer.errors import DitError

COMMAND_MODULES = (
    "dit_trainer.train.cli",  # dit train
    "dit_trainer.plan.cli",  # dit plan
    "dit_trainer.sample.cli",  # dit sample
    "dit_trainer.sample.ddp",  # dit sample-ddp
    "dit_trainer.demo",  # dit demo
    "dit_trainer.data.cli",  # dit extract, dit data convert|verify
    "dit_trainer.evaluate.cli",  # dit eval
    "dit_trainer.convert",  # dit convert
    "dit_trainer.phema.cli",  # dit ema
    "dit_trainer.plot",  # dit plot
)


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to each option's help unless the help already says it or X is None/False."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows every option's default (subcommand parsers inherit it)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = Parser(prog="dit", description="Train and sample Diffusion Transformers.")
    parser.add_argument("--version", action="version", version=f"dit-trainer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
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
        code = int(args.func(args) or 0)
    except DitError as err:
        print(f"dit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        from dit_trainer.fs import DISK_ERRNOS

        if err.errno not in DISK_ERRNOS:
            raise
        # A full disk, a quota, a read-only mount or an I/O error under any command: the disk's
        # problem, not the code's, so one line naming the path instead of a traceback.
        print(f"dit {args.command}: error: {err.filename or 'a file'}: {err.strerror}; free space, fix the "
              "permissions or the mount, then rerun", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    leave_process_group()
    return code


def leave_process_group() -> None:
    """End the process group a command joined (under torchrun) once it has finished."""
    # Left to the interpreter's exit, NCCL warns of a group never destroyed, and a gloo worker thread
    # torn down with the interpreter can abort a rank whose work is done. Looked up, not imported:
    # a command that never loaded torch (`dit --help`, the MindSpore engine) has no group.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        # A finished trainer sits in reference cycles that hold the group's sub-groups (its mesh,
        # FSDP's state): freed now, not by the interpreter's exit after the group is gone.
        gc.collect()
        dist.destroy_process_group()
