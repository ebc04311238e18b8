"""The command line: thin shells over the library (`specdec_cli.pair` and below). app.py holds the
Typer app and maps errors to exit codes; options.py declares the shared options once; one module
per command, registered here (`specdec ui` is web.py; its page is specdec_cli/webui); ui.py and plots.py are views that consume what the library returns."""

import inspect
from collections.abc import Callable
from typing import Any

from typer.core import TyperOption

from . import batch, calibrate, describe, eval, presets, serve, web
from .app import Command, app

# Options every command takes, written once (they belong to `specdec` itself; app.py moves them
# before the command, so they work after it too): each command's --help ends with them.
COMMON_OPTIONS = ("Common options, before or after the command: --threads N (CPU threads for torch). "
                  "specdec --help lists the commands; specdec --version prints the version.")

# Typer 0.29 prints a type for every option, flags included (`<bool>` on each --json, --quiet …),
# which says nothing a flag's name does not. A flag shows no type; every other option keeps its own.
_typed = TyperOption.display_type_rich


def _type_column(self: TyperOption, ctx: Any) -> str | None:
    return None if self.is_flag and self.metavar is None else _typed(self, ctx)


TyperOption.display_type_rich = _type_column  # type: ignore[method-assign]


def _flowed(command: Callable[..., Any]) -> str:
    """The command's docstring with each paragraph on one line: Typer's Rich help keeps a
    docstring's line breaks, which break sentences mid-line at any width; one line per paragraph
    lets Rich wrap it at the terminal's width."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(command.__doc__ or "").split("\n\n"))


for name, command in (("describe", describe.describe), ("batch", batch.batch), ("presets", presets.presets),
                      ("serve", serve.serve), ("eval", eval.evaluate_command), ("calibrate", calibrate.calibrate),
                      ("ui", web.web)):
    app.command(name, cls=Command, help=_flowed(command), epilog=COMMON_OPTIONS)(command)
