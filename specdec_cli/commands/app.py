"""The `specdec` command line: the Typer app, its global options, and the one place an error
becomes a message and an exit code (`report_error`): 0 ok, 1 runtime failure, 2 bad usage or
input, 130 interrupted.

Commands are thin (one module each beside this one, registered on `app` by the package's
__init__, so importing this module gives the whole program): parse the options, call the library
(`specdec_cli.pair` and the modules under it), print. Data goes to stdout (a sentence, a record,
a table); everything else for humans (live view, progress, warnings, errors) goes to stderr.
"""

from __future__ import annotations

import sys
import traceback
import warnings
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from .. import __version__
from ..errors import SpecdecError, one_line
from ..fast_imports import debugging, quiet_libraries


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the user needs to know (what was kept, how to go on)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def report_error(exc: BaseException) -> int:
    """The one place an exception becomes a line on stderr and an exit code."""
    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, Interrupted):
        sys.stderr.write(f"interrupted: {exc.message}\n")
        return 130
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return 130
    if isinstance(exc, SpecdecError):
        sys.stderr.write(f"error: {exc.message}\n")
        return exc.exit_code
    detail = one_line(exc)
    hint = "" if debugging() else " (set SPECDEC_DEBUG=1 for the traceback)"
    sys.stderr.write(f"error: unexpected {detail}{hint}\n")
    return 1


# Options of the whole program that may also come after the command (`describe x.wav --threads 1`),
# with whether each takes a value.
GLOBAL_OPTIONS = {"--threads": True}


def global_options_first(args: list[str]) -> list[str]:
    """`args` with every global option moved before the command, in order (nothing after `--` moves)."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            takes_value = GLOBAL_OPTIONS[name] and "=" not in arg
            front += args[i:i + 1 + takes_value]
            i += 1 + takes_value
            continue
        rest.append(arg)
        i += 1
    return front + rest


class _Group(TyperGroup):
    """Routes every exception a command raises through `report_error`, and reads global options
    wherever they stand. Doing it here rather than around `app()` makes CliRunner tests see
    exactly what the installed command does."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, global_options_first(args))

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, SystemExit):
            raise  # Typer's own flow: --help, --version, usage errors (exit 2)
        except (KeyboardInterrupt, Exception) as exc:  # KeyboardInterrupt: exit 130, not "Aborted!"
            raise typer.Exit(report_error(exc)) from None


app = typer.Typer(
    name="specdec",
    cls=_Group,
    help="Describe a speaker in one Chinese sentence with edge-cloud speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specdec {__version__}")
        raise typer.Exit()


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    """A library warning (a clip below the models' rate, …) as one line on stderr."""
    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    threads: Annotated[int | None, typer.Option("--threads", min=1, show_default=False,
                                                help="CPU threads for torch (default: torch's own choice). "
                                                     "1 is often fastest for the tiny demo pair on a busy machine. "
                                                     "Before or after the command.")] = None,
) -> None:
    """Describe a speaker in one Chinese sentence with edge-cloud speculative decoding."""
    quiet_libraries()  # every command keeps stderr to our own lines
    if not debugging():
        warnings.showwarning = _one_line_warning
    if threads is not None:
        from ..models import pin_threads  # torch only when asked: --version and flag errors stay instant

        pin_threads(threads)


def main() -> None:
    """Console-script entry point (`specdec`, `python -m specdec_cli`)."""
    try:
        app(prog_name="specdec")
    except KeyboardInterrupt as exc:  # during option parsing, before the group's own mapping
        sys.exit(report_error(exc))
