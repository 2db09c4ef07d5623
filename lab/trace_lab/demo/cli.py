"""`trace-rollout-demo`: the demo's command.

A failure the user can act on (an invalid option, a service that cannot be reached or refuses the demo)
is one line on stderr, `trace-rollout-demo: error: ...`, with exit status 2 for bad input (as argparse's
own errors) and 1 for the rest; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Final, NoReturn

from trace_client import TraceAPIError, TraceConnectionError
from trace_lab.demo import loop
from trace_lab.demo.config import add_arguments, config_from_arguments
from trace_lab.demo.report import results_document

PROG: Final = "trace-rollout-demo"
#: What the demo does, in one line (the first of `--help`'s description, and the README's table).
SUMMARY: Final = "TRACE against uniform allocation on a simulated workload: a table and a plot"
#: Exit status of a usage error: an invalid option.
USAGE_ERROR: Final = 2


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (the usage block is what --help is for)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=f"{SUMMARY}. Drive a simulated multi-turn workload through the service with each policy "
        "at the same budget and compare them. Without --url the service runs in this process.",
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_arguments(args)
    except ValueError as error:
        return _fail(str(error), USAGE_ERROR)
    try:
        report = loop.run(config, write=loop.write_stderr if args.json else loop.write_stdout)
    except loop.ServiceNotInstalled as error:
        return _fail(str(error))
    except TraceConnectionError as error:
        return _fail(f"the service at {config.url} is unreachable: {error}")
    except TraceAPIError as error:
        return _fail(f"the service at {config.url} answered {error}")
    if args.json:
        loop.write_stdout(json.dumps(results_document(report), indent=2) + "\n")
    return 0


def _fail(message: str, status: int = 1) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status
