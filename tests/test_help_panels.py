"""Help grouped into panels (issue 52, point 8): `describe --help` at 80 columns was 144 lines with
the options in two catch-all groups; now it is in panels a person reads in order (Input, Decoding,
Cloud, Models, Output) and fits two screens of 56 lines. The count is of the lines as printed."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from specdec_cli.commands.app import app

SCREEN = 56


def help_lines(command: str) -> list[str]:
    done = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80", "NO_COLOR": "1", "TERMINAL_WIDTH": None})
    assert done.exit_code == 0, done.output
    return done.output.splitlines()


def test_describe_help_fits_two_screens_at_80_columns():
    assert len(help_lines("describe")) <= 2 * SCREEN


@pytest.mark.parametrize("command", ["describe", "batch"])
def test_options_are_in_panels_in_reading_order(command):
    lines = help_lines(command)
    titles = [line[:-1] for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    panels = [t for t in titles if t in ("Input", "Decoding", "Cloud", "Models", "Output")]
    assert panels == ["Input", "Decoding", "Cloud", "Models", "Output"], titles

    def panel_of(option: str) -> str:
        title = None
        for line in lines:
            if line and not line.startswith(" ") and line.endswith(":"):
                title = line[:-1]
            elif re.match(r"^  (?:-\w, )?" + re.escape(option.strip()) + r"(\s|$)", line):
                return title
        raise AssertionError(option)

    assert panel_of("--segment") == "Input"
    assert panel_of("--preset") == panel_of("--sample / --greedy") == panel_of("--instruction") == "Decoding"
    for option in ("--cloud ", "--cloud-timeout", "--upload", "--depth", "--on-cloud-failure", "--cloud-deadline"):
        assert panel_of(option) == "Cloud", option
    assert panel_of("--edge ") == panel_of("--dtype") == "Models"
    assert panel_of("--json" if command == "describe" else "--out") == "Output"
