"""`amc … --help` in plain words: each option's placeholder (`--host HOST_ID`), no `<str>`.

Typer writes the Python type after every argument and option (`TASK_ID <str>`, `--limit
<int>`); the commands here give each a real placeholder instead (`metavar`), so the type
label is dropped from the help records. Everything else is Typer's own help.
"""

from __future__ import annotations

import re
from typing import Any

import typer.core

# Typer ships its own copy of click (typer._click): its commands take these types.
from typer._click import Command, Context, HelpFormatter

from console.cli_numbers import whole_numbers_only

#: " <str>", " <list[str]>", " <int>", … at the end of a help record's name.
_TYPE_LABEL = re.compile(r" <[^<>]*>$")


def _plain_options(command: Command, ctx: Context, formatter: HelpFormatter) -> None:
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        name, text = record
        plain = (_TYPE_LABEL.sub("", name), text)
        (arguments if param.param_type_name == "argument" else options).append(plain)
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)


class PlainCommand(typer.core.TyperCommand):
    """A command whose help shows placeholders, not Python types."""

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        _plain_options(self, ctx, formatter)
        self.format_commands_if_any(ctx, formatter)

    def format_commands_if_any(self, ctx: Context, formatter: HelpFormatter) -> None:
        """A command has no subcommands (a group lists them itself)."""


class PlainGroup(typer.core.TyperGroup):
    """A command group whose help shows placeholders, not Python types, and whose commands'
    whole-number options take digits only (`console.cli_numbers`)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in self.commands.values():
            if not isinstance(command, PlainGroup):  # a group checks its own commands
                whole_numbers_only(command.params)

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        _plain_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)
