"""The command line: thin shells over the library (`specdec_cli.pair` and below). app.py holds the
Typer app and maps errors to exit codes; options.py declares the shared options once; one module
per command, registered here; ui.py and plots.py are views that consume what the library returns."""

import inspect
from collections.abc import Callable
from typing import Any

from . import batch, calibrate, describe, eval, presets, serve
from .app import app


def _flowed(command: Callable[..., Any]) -> str:
    """The command's docstring with each paragraph on one line: Typer's Rich help keeps a
    docstring's line breaks, which break sentences mid-line at any width; one line per paragraph
    lets Rich wrap it at the terminal's width."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(command.__doc__ or "").split("\n\n"))


for name, command in (("describe", describe.describe), ("batch", batch.batch), ("presets", presets.presets),
                      ("serve", serve.serve), ("eval", eval.evaluate_command), ("calibrate", calibrate.calibrate)):
    app.command(name, help=_flowed(command))(command)
