"""`--help` as a person reads it (issue 36): flags show no `<bool>` type, options that take a value
keep theirs, and every command's help names the options common to all commands once."""

import re

import pytest
from cli_helpers import run_specdec

COMMANDS = ["describe", "batch", "presets", "serve", "eval", "calibrate", "ui"]


@pytest.mark.spawns
@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_no_bool_type_and_names_the_common_options(command):
    done = run_specdec(command, "--help")
    assert done.returncode == 0, done.stderr
    text = re.sub(r"\s+", " ", done.stdout.replace("│", " "))
    assert "<bool>" not in done.stdout
    assert "Common options, before or after the command: --threads N" in text
    if command == "describe":  # the control: an option with a value still says what it takes
        assert "<path>" in done.stdout and "--quiet" in done.stdout


@pytest.mark.spawns
def test_threads_after_the_command_works_as_the_help_says():
    done = run_specdec("presets", "--threads", "1")
    assert done.returncode == 0, done.stderr
