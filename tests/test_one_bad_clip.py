"""Issue 44, point 7: one bad file given to `describe` is refused before the models load, as
several are (inputs.check_clips); its message and exit code stay the command's."""

from __future__ import annotations

import pytest
from cli_helpers import bad_corpus
from typer.testing import CliRunner

from specdec_cli.commands import describe as describe_command
from specdec_cli.commands.app import app


def test_one_file_that_is_not_audio_is_refused_before_the_models_load(tmp_path, monkeypatch):
    path, phrase = bad_corpus(tmp_path)["not_audio"]

    def load(*args, **kwargs):
        pytest.fail("the models were loaded for a file that is not audio")

    monkeypatch.setattr(describe_command, "load", load)
    result = CliRunner().invoke(app, ["describe", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and phrase in result.stderr and str(path) in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
