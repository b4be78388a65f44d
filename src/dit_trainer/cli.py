"""The `dit` command: subcommands are registered by the modules that own them."""

import argparse
import sys


def main(argv=None) -> int:
    """Entry point of the `dit` console script."""
    parser = argparse.ArgumentParser(prog="dit", description="Train and sample Diffusion Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    del sub
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return 0
