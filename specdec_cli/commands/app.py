"""The `specdec` command line: the Typer app, its global options, and the one place an error
becomes a message and an exit code (`report_error`): 0 ok, 1 runtime failure, 2 bad usage or
input, 130 interrupted.

Commands are thin (one module each beside this one, registered on `app` by the package's
__init__, so importing this module gives the whole program): parse the options, call the library
(`specdec_cli.pair` and the modules under it), print. Data goes to stdout (a sentence, a record,
a table); everything else for humans (live view, progress, warnings, errors) goes to stderr.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand, TyperGroup

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


# Below this width, a command's --help is Click's two-column list instead of Typer's Rich panels.
# Rich sizes the panels' columns (option, type, help) by shrinking every wrappable one to a common
# width, so at 80 columns the help column was ~20 characters (describe --help: 204 lines) and long
# option names and defaults were cut with an ellipsis (`--max-sessions-per-to…`). Click's list
# keeps each name whole and moves the help under a name too long for the first column. At 100
# columns and more the panels cut nothing (checked for every command), so they stay there.
RICH_HELP_MIN_WIDTH = 100


def help_width() -> int:
    """The width Typer's help console would have: $TERMINAL_WIDTH as Typer reads it, else Rich's
    own choice ($COLUMNS, the terminal, 80 off one)."""
    from rich.console import Console

    given = os.environ.get("TERMINAL_WIDTH")
    return Console(width=int(given) if given and given.isdigit() else None).width


class Command(TyperCommand):
    """A command whose --help fits the terminal: Typer's Rich panels where they fit, else Click's
    list, still grouped under the panels' titles (Models, Decoding, …)."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if help_width() >= RICH_HELP_MIN_WIDTH:
            return super().format_help(ctx, formatter)
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            default = "Arguments" if param.param_type_name == "argument" else "Options"
            # Help texts are written for Rich, where `\[` keeps `[serve]` from being read as markup.
            sections.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(
                (record[0], record[1].replace("\\[", "[")))
        # The panels in the order a person reads a command line: what goes in, how it is decoded,
        # the cloud, the models, what comes out; any other after them, the plain options last.
        order = ["Arguments", "Input", "Decoding", "Cloud", "Models", "Output"]
        titles = sorted(sections, key=lambda t: (order.index(t) if t in order else len(order) + (t == "Options")))
        for title in titles:
            rows = sections[title]
            if rows:
                with formatter.section(title):
                    _write_dl(formatter, rows)


def _write_dl(formatter: click.HelpFormatter, rows: list[tuple[str, str]], col_max: int = 30) -> None:
    """Click's `write_dl` (names, then help wrapped beside them, or under a name wider than
    `col_max`), except that the help never breaks at a hyphen: Click's wrapper would cut
    `--cloud-deadline` named in a help text into `--cloud-` and `deadline`."""
    import textwrap

    first = min(max(len(name) for name, _ in rows), col_max) + 2
    indent = " " * formatter.current_indent
    text_width = max(formatter.width - first - formatter.current_indent, 10)
    for name, help in rows:
        formatter.write(f"{indent}{name}")
        lines = textwrap.wrap(help, text_width, break_on_hyphens=False, break_long_words=False)
        if not lines:
            formatter.write("\n")
            continue
        if len(name) <= first - 2:
            formatter.write(" " * (first - len(name)))
        else:  # a long name: its help starts on the next line, in the help column
            formatter.write("\n" + indent + " " * first)
        formatter.write(lines[0] + "\n")
        for line in lines[1:]:
            formatter.write(f"{indent}{' ' * first}{line}\n")


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
