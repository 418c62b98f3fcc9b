"""``posswap``'s entry point: build the parser, run the command, and turn an error into one line on stderr (exit 2
for what the user can fix, 1 for anything else; ``--debug`` shows the traceback)."""

from __future__ import annotations

import argparse
import sys

import yaml

from ..extras import MissingExtra
from ..version import __version__
from . import parsers
from .args import Parser
from .study import add_study


def build_parser() -> argparse.ArgumentParser:
    """The commands, one ``_add_<command>`` each; ``--debug`` is taken before or after the command."""
    parser = Parser(prog="posswap", description="Swap the position handling of pretrained transformers.")
    parser.add_argument("--debug", action="store_true", help="Show the full traceback of an error.")
    parser.add_argument("--version", action="version", version=f"posswap {__version__}", help="Show the version.")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (
        parsers.add_patch,
        parsers.add_demo,
        parsers.add_eval,
        parsers.add_train,
        add_study,
        parsers.add_push,
        parsers.add_export,
    ):
        add(commands)
    for sub in commands.choices.values():  # SUPPRESS keeps a --debug given before the command
        sub.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="Show the full traceback of an error."
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # a bad flag: argparse printed its one line; --help (0) still exits
        if not done.code:
            raise
        return done.code
    try:
        args.run(args)
    except KeyboardInterrupt:
        print(f"posswap {args.command}: interrupted.", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            raise
        return _report(args.command, error)
    return 0


MAX_MESSAGE = 400


def _report(command: str, error: Exception) -> int:
    """One line on stderr: exit 2 for what the user can fix (inputs, files, memory), 1 for anything else."""
    message = " ".join(str(error).split()) or type(error).__name__
    if len(message) > MAX_MESSAGE:  # one line, whatever value a message quotes
        message = message[: MAX_MESSAGE - 100] + " ... " + message[-95:]  # the advice is often at the end
    if _disk_full(error):  # safetensors and torch report it as their own errors
        print(
            f"posswap {command}: error: the disk is full (No space left on device); free some space and run again. ({message})",
            file=sys.stderr,
        )
        return 2
    if isinstance(error, _USER_ERRORS) or _out_of_memory(error):
        print(f"posswap {command}: error: {message}", file=sys.stderr)
        return 2
    print(
        f"posswap {command}: unexpected {type(error).__name__}: {message} (run with --debug for the traceback)",
        file=sys.stderr,
    )
    return 1


# A user's mistake: a bad value (ValueError, TypeError), a file that is missing or unreadable (OSError),
# a file that is not YAML, no memory for what was asked, an extra to install.
# An optional dependency that is not installed names its extra (MissingExtra).
_USER_ERRORS = (ValueError, TypeError, OSError, yaml.YAMLError, MemoryError, MissingExtra)


def _disk_full(error: BaseException) -> bool:
    import errno

    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error) or "StorageFull" in str(error) or "os error 28" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _out_of_memory(error: Exception) -> bool:
    torch = sys.modules.get("torch")  # an error from torch means torch is loaded; none without it
    return (torch is not None and isinstance(error, torch.OutOfMemoryError)) or (
        isinstance(error, RuntimeError) and "allocate" in str(error)
    )
