"""The pieces every ``posswap`` command's parser is built from: argparse with posswap's conventions.

- Errors are one line, like every other posswap error (the usage is in ``--help``); an argument no parser takes
  is refused by the command it was given to, naming the flag it is near (``--sett``: did you mean --set?).
- A value not among a flag's or the command's choices says which it is near (``posswap trian``: did you mean
  train?).
- No abbreviations: ``--rope-typ`` is an unknown flag, not ``--rope-type`` (argparse's default guesses).
- List flags take values separated by spaces and may be repeated (``--lengths 256 512 --lengths 1024``).
- A flag that was renamed says what replaced it.
- Each command's ``--help`` opens with a paragraph saying what it does and one example (:func:`described`)."""

from __future__ import annotations

import argparse
import difflib
import textwrap
from collections.abc import Callable
from typing import Any

import yaml

from .facts import RENAMED_IN


class Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors on one line and no abbreviated flags; the subcommands' parsers are of this
    class too (argparse makes them with the parent's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action, value):
        """argparse's check of a value against ``choices`` (a command's name, ``--method``), whose refusal says
        which choice a misspelt value is near: ``posswap trian`` -> did you mean train? (Python 3.14's
        ``suggest_on_error``, which 3.11 lacks)."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as error:
            choices = [str(choice) for choice in action.choices or ()]
            near = difflib.get_close_matches(str(value), choices, n=1)
            if not near or "did you mean" in error.message:
                raise
            raise argparse.ArgumentError(action, f"{error.message}; did you mean {near[0]}?") from None

    def parse_args(self, args=None, namespace=None):
        """argparse's, except that arguments nothing took are refused by the command they were given to (argparse
        reports them as the top-level parser's: ``posswap: error``), with the flag each is near."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command(namespace)
            command.error(f"unrecognized arguments: {' '.join(extras)}{near_flags(extras, command)}")
        return namespace

    def _command(self, namespace) -> argparse.ArgumentParser:
        """The parser of the command ``namespace`` holds (this parser without one)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(namespace, action.dest, None))
                if chosen is not None:
                    return chosen._command(namespace) if isinstance(chosen, Parser) else chosen
        return self


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help, whose description and epilog paragraphs are wrapped to the terminal as usual, except a
    paragraph with indented lines (an example command, a list of options), which is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = text.split("\n\n")
        kept = lambda p: any(line.startswith(" ") for line in p.splitlines())  # noqa: E731
        return "\n\n".join(
            p if kept(p) else textwrap.fill(" ".join(p.split()), width, initial_indent=indent, subsequent_indent=indent)
            for p in paragraphs
        )


def described(text: str, example: str) -> dict[str, Any]:
    """``add_parser`` arguments for a command's ``--help`` paragraph: what it does (``text``) and one ``example``
    command on a line of its own."""
    return {"description": f"{text}\n\nexample:\n  {example}", "formatter_class": Formatter}


def near_flags(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """``; did you mean --set?`` for each unknown flag among ``extras`` that is near one of ``parser``'s flags (not
    the renamed ones, which answer for themselves)."""
    flags = [flag for action in parser._actions if not isinstance(action, Renamed) for flag in action.option_strings]
    near = []
    for extra in extras:
        if extra.startswith("-"):
            match = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1)
            if match and match[0] not in near:
                near.append(match[0])
    return f"; did you mean {' or '.join(near)}?" if near else ""


def yaml_value(text: str) -> Any:
    """``4096`` -> 4096, ``0.5`` -> 0.5, ``1e6`` -> 1000000.0, ``yarn`` -> "yarn", ``null`` -> None: the config
    validates the type."""
    from ..config import load_yaml  # when a value is parsed: building the parser imports no torch

    try:
        return load_yaml(text)
    except yaml.YAMLError as error:  # argparse reports ArgumentTypeError as one usage line
        raise argparse.ArgumentTypeError(
            f"not valid YAML: {getattr(error, 'problem', None) or type(error).__name__}"
        ) from None


class Renamed(argparse.Action):
    """A flag that was in posswap's README and no longer exists: one line naming what replaced it."""

    def __init__(self, option_strings, dest, message: str = "", **kwargs):
        super().__init__(option_strings, dest, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.message)


def renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    parser.add_argument(old, action=Renamed, message=f"{old} was renamed {new} in posswap {RENAMED_IN}; use {new}.")


def items(kind: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    """argparse type of one value of a list flag (``--lengths 256 512``): a comma-separated value is refused,
    showing the space-separated form."""

    def parse(text: str) -> Any:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if len(parts) > 1:
            raise argparse.ArgumentTypeError(f"values are separated by spaces, not commas: {flag} {' '.join(parts)}")
        return kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse's "invalid int value" names the kind
    return parse


def list_flag(parser, flag: str, kind: Callable = str, **kwargs) -> None:
    """A list flag, posswap's one convention: values separated by spaces, the flag repeatable."""
    parser.add_argument(flag, nargs="+", action="extend", type=items(kind, flag), default=None, **kwargs)
