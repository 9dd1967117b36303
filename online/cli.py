"""The `draftgym` command line: one parser, subcommands registered by each layer.

Imports flow online -> simulator -> pipeline, so the top-level parser lives here.
"""
from __future__ import annotations

import argparse
import sys

from pipeline.cliargs import DefaultsHelpFormatter
from pipeline.errors import DraftGymError


def build_parser() -> argparse.ArgumentParser:
    from online.policy_cost import add_profile_policy
    from online.validate import add_validate
    from pipeline import cli as pipeline_cli
    from simulator import cli as simulator_cli

    parser = argparse.ArgumentParser(prog="draftgym", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pipeline_cli.register(sub)
    simulator_cli.register(sub)
    add_validate(sub)
    add_profile_policy(sub)
    for sp in sub.choices.values():           # every option's default in --help
        sp.formatter_class = DefaultsHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DraftGymError as e:
        print(f"draftgym: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftgym: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
