"""Whole-number options of the command line are written in digits (`webui.numbers`).

Typer reads an `int` option through pydantic in lax mode: "--max-attempts 1_0" queued a task
with ten attempts, "+3" and "3.0" passed as 3. `whole_numbers_only` puts a check of the text
typed (or set in the option's environment variable) before each such option's own parsing;
`console.cli_help.PlainGroup` applies it to every command of every group, so an option added
later is covered without a word of its own. A refusal is a usage error (exit 2) naming the
option, before any call to the cloud.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from typer._click import Context, Parameter
from typer._click.exceptions import BadParameter
from typer.core import TyperArgument, TyperOption

from webui.numbers import NOT_WHOLE, takes_int, written_whole


def whole_numbers_only(params: Iterable[Parameter]) -> None:
    """Make each int option or argument among `params` refuse text that is not digits."""
    for param in params:
        if isinstance(param, TyperOption | TyperArgument) and takes_int(
            param.type_descriptor.annotation
        ):
            param.process_value = _checked(param)  # type: ignore[method-assign]  # this one's


def _checked(param: TyperOption | TyperArgument) -> Any:
    parse = param.process_value

    def process_value(ctx: Context, value: Any) -> Any:
        for text in value if isinstance(value, list | tuple) else (value,):
            if isinstance(text, str) and not written_whole(text):
                raise BadParameter(f"{text!r} {NOT_WHOLE}.", ctx=ctx, param=param)
        return parse(ctx, value)

    return process_value
