"""Issue 44, point 6: what the commands print fits an 80-column terminal. Nothing is cut with an
ellipsis: help keeps every option's full name and default, the live table folds its columns onto
more rows, the trace wraps each block under its own line, the presets table keeps paths whole.

The commands run for real through CliRunner with COLUMNS=80. Where the output is for a person at a
terminal (the live view, the trace), TTY_COMPATIBLE=1 makes Rich treat the captured stream as a
terminal, as it treats a real one. Widths are terminal cells (a CJK character takes two)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from typer.main import get_command
from typer.testing import CliRunner

from specdec_cli.commands.app import app

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80
# Cursor moves and colours (the live view redraws in place), and the OSC sequences of links.
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
COMMANDS = ["describe", "batch", "presets", "serve", "eval", "calibrate", "ui"]


def run(*args: str, terminal: bool = False):
    env = {"COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERMINAL_WIDTH": None}
    if terminal:
        env["TTY_COMPATIBLE"] = "1"
    return CliRunner().invoke(app, list(args), env=env)


def screen_lines(text: str) -> list[str]:
    """The lines a terminal shows: escapes gone, a carriage return starts a line as a newline does."""
    return re.split(r"\r\n|\n|\r", ESCAPES.sub("", text))


def too_wide(text: str) -> list[str]:
    return [f"{cell_len(line)}: {line}" for line in screen_lines(text) if cell_len(line) > WIDTH]


def flat(text: str) -> str:
    """The text with every run of whitespace (and the help panels' borders) as one space."""
    return " ".join(text.replace("│", " ").split())


# -- help ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_keeps_every_option_whole(command):
    result = run(command, "--help")
    assert result.exit_code == 0, result.output
    assert not too_wide(result.stdout)
    text = flat(result.stdout)
    click_command = get_command(app).commands[command]  # type: ignore[attr-defined]
    for param in click_command.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("--"):  # the whole name, not "--max-sessions-per-to…"
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), name
        default = param.default
        if param.show_default and default not in (None, False, True, "") and not callable(default):
            shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
            shown = getattr(default, "value", shown)
            assert f"default: {shown}" in text, (param.name, shown)  # not "10,25,40,50,60,75,9…"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_cuts_no_word(command):
    """The only ellipses are the ones the help texts write (`http://…`, `MP3, …`)."""
    result = run(command, "--help")
    for line in screen_lines(result.stdout):
        cut = re.findall(r"\S…", line.replace("http://…", "").replace("specdec …", ""))
        assert not cut, line


def test_describe_help_is_readable_at_80_columns():
    """204 lines when the help column was 20 characters wide."""
    lines = run("describe", "--help").stdout.splitlines()
    assert len(lines) < 150, len(lines)


# -- describe: the live view and the trace ---------------------------------------------------------

@pytest.fixture(scope="module")
def on_a_terminal():
    """The bundled demo pair at k 12 on a clip whose blocks are long: the live table and the trace
    are wider than 80 columns unless they fold."""
    clip = ROOT / "samples" / "f_mid_mid_loud.wav"  # v4: two of its k-12 blocks are cut by the cloud
    result = run("--threads", "1", "describe", str(clip), "--k", "12", "--trace", "--panel", terminal=True)
    assert result.exit_code == 0, result.output
    log = CliRunner().invoke(app, ["--threads", "1", "describe", str(clip), "--k", "12", "--trace"])
    assert log.exit_code == 0, log.output
    return result, log


def test_describe_on_an_80_column_terminal_fits(on_a_terminal):
    result, _ = on_a_terminal
    assert "draft" in result.stderr  # the live view was drawn
    assert not too_wide(result.stderr)
    assert not too_wide(result.stdout)


def test_the_live_table_folds_rather_than_cutting(on_a_terminal):
    result, _ = on_a_terminal
    text = ESCAPES.sub("", result.stderr)
    rest = text.replace("loading models…", "").replace("decoding (spec)…", "")
    assert "…" not in rest, [ln for ln in screen_lines(rest) if "…" in ln][:5]  # was `H na…`, `verd…`, `1…`
    assert "H nats" in text and "verdict" in text and "cloud recovered" in text


def _blocks(lines: list[str]) -> tuple[dict[int, str], list[str]]:
    """Each trace block's text, its continuation lines joined to its first one; and the trace's
    lines as printed, its header's included."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith("trace ·"))
    blocks: dict[int, str] = {}
    current = None
    end = len(lines)
    for i, line in enumerate(lines[start + 1:], start + 1):
        m = re.match(r"^\s*(\d+)\s", line)
        if m:
            current = int(m[1])
            blocks[current] = line
        elif current is not None and line.strip().startswith("│"):
            blocks[current] += " " + line.strip().removeprefix("│")
        elif current is not None:
            end = i
            break
    return blocks, lines[start:end]


def test_the_trace_wraps_each_block_and_keeps_every_token(on_a_terminal):
    result, log = on_a_terminal
    wrapped, printed = _blocks(screen_lines(result.stderr))
    whole, _ = _blocks(log.stderr.splitlines())  # off a terminal: one line per block, as a log keeps it
    assert not too_wide("\n".join(printed))  # 138-191 columns before
    assert len(wrapped) == len(whole) >= 2
    assert any(cell_len(line) > WIDTH for line in whole.values())  # the case: blocks wider than 80
    for n, line in whole.items():
        assert flat(wrapped[n]) == flat(line), n


# -- presets ---------------------------------------------------------------------------------------

def test_presets_fits_80_columns_and_keeps_paths_whole():
    result = run("presets")
    assert result.exit_code == 0, result.output
    assert not too_wide(result.stdout)
    words = flat(result.stdout).split()
    assert "specdec_cli/demo/models/edge/specdec_presets.toml" in words  # not `…/e` + `dge/…`
