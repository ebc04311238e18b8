"""The Python API (`from specdec import Pair`, issue 19) against independent oracles: the README's
example run as written (its printed output compared with the README's), the CLI's record for the
same clip and settings, a file holding the same waveform, and the callback's events."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from specdec import Pair, Result
from specdec_cli.commands.app import app
from specdec_cli.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "m_slow_low.wav"
TIMING = ("latency_s", "tokens_per_s")


def readme_example() -> tuple[str, str]:
    """The code block of the README's "Python API" section and the output block after it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    out = re.search(r"```text\n(.*?)```", section, re.S)
    assert code and out, "the README's Python API section lost its example or its output"
    return code.group(1), out.group(1)


def same_lines(got: str, expected: str) -> bool:
    """Line by line equal, numbers within 0.01 (entropies printed to 2 decimals may round apart
    on another CPU's float kernels)."""
    a, b = got.strip().splitlines(), expected.strip().splitlines()
    if len(a) != len(b):
        return False
    number = re.compile(r"\d+\.\d+")
    for x, y in zip(a, b, strict=True):
        if number.sub("#", x) != number.sub("#", y):
            return False
        if any(abs(float(u) - float(v)) > 0.011 for u, v in zip(number.findall(x), number.findall(y), strict=True)):
            return False
    return True


def test_the_readme_example_runs_and_prints_what_the_readme_shows(monkeypatch):
    code, expected = readme_example()
    monkeypatch.chdir(ROOT)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md (Python API)", "exec"), {"__name__": "readme_example"})
    assert same_lines(printed.getvalue(), expected), printed.getvalue()


@pytest.fixture(scope="module")
def pair() -> Pair:
    return Pair()


def cli_record(*args: str) -> dict:
    result = CliRunner().invoke(app, ["describe", *args, "--json", "--no-live"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING}


@pytest.mark.parametrize("settings", [{}, {"preset": "quality"}, {"mode": "cloud"},
                                      {"sample": True, "seed": 4, "temperature": 0.8, "top_p": 0.9, "k": 5}])
def test_a_result_is_the_clis_record(pair, settings):
    flags = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    expected = cli_record(str(SAMPLE), *flags)
    result = pair.describe(str(SAMPLE), **settings)
    assert isinstance(result, Result)
    assert without_timing(result.record) == without_timing(expected)
    assert result.description == expected["description"] and result["cloud_calls"] == expected["cloud_calls"]
    assert pair.text(result.token_ids).strip() == expected["description"]
    if result.mode == "spec":
        assert result.events and result.events[-1].done
        assert result.events[-1].answer == result.token_ids


def test_a_waveform_equals_the_file_holding_it(pair, tmp_path):
    """A waveform at 8 kHz, stereo, given in memory, is described as the WAV file holding it."""
    audio, rate = sf.read(SAMPLE, dtype="float32")
    import librosa

    low = librosa.resample(audio, orig_sr=rate, target_sr=8000)
    stereo = np.stack([low, 0.5 * low], axis=1)
    path = tmp_path / "stereo8k.wav"
    sf.write(path, stereo, 8000, subtype="FLOAT")
    from_file = pair.describe(str(path))
    in_memory = pair.describe(stereo, rate=8000)
    assert in_memory.file == "<waveform>" and from_file.file == str(path)
    assert in_memory.token_ids == from_file.token_ids
    assert in_memory.audio_s == from_file.audio_s
    same_rate = pair.describe(audio, rate=rate)
    assert same_rate.token_ids == pair.describe(str(SAMPLE)).token_ids


def test_blocks_as_they_are_decided(pair):
    seen = []
    result = pair.describe(str(SAMPLE), on_block=seen.append, k=3)
    stream = pair.stream(str(SAMPLE), k=3)
    streamed = list(stream)
    assert len(seen) == len(result.events) > 2
    assert [e.answer for e in streamed] == [e.answer for e in seen] == [e.answer for e in result.events]
    assert stream.result is not None and stream.result.token_ids == result.token_ids
    assert all(len(a.answer) < len(b.answer) for a, b in zip(seen, seen[1:], strict=False))


def test_errors(pair):
    audio, rate = sf.read(SAMPLE, dtype="float32")
    with pytest.raises(ValueError, match="needs its sampling rate"):
        pair.describe(audio)
    with pytest.raises(ValueError, match="rate is for waveforms"):
        pair.describe(str(SAMPLE), rate=16000)
    with pytest.raises(InputError, match="unknown preset"):
        pair.describe(str(SAMPLE), preset="nope")
    with pytest.raises(InputError, match="top_p must be in"):
        pair.settings(top_p=2.0)
    with pytest.raises(InputError, match="silent"):
        pair.describe(np.zeros(16000, np.float32), rate=16000)
    with pytest.raises(InputError, match="top_p must be in"):
        pair.stream(str(SAMPLE), top_p=2.0)
    assert pair.settings("quality", k=3).k == 3 and pair.settings(instruction="只说情绪。").instruction == "只说情绪。"


def test_the_package_is_installed_with_specdec_cli():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    include = re.search(r"include = \[(.*?)\]", text).group(1)
    assert '"specdec"' in include and '"specdec_cli*"' in include
    assert os.path.isfile(ROOT / "specdec" / "__init__.py")


def test_a_file_over_the_window_is_answered_in_the_apis_terms(pair, tmp_path):
    """Issue 44: from Python, a clip over 30 s said "add --segment", an option the API has not; it
    names what the API has (Pair.segments, describe_many's segment=True), and the command line
    still names its option."""
    long = tmp_path / "long.wav"
    sf.write(str(long), np.full(31 * 1000, 0.1, np.float32), 1000)  # 31 s at 1 kHz: small, over the window
    with pytest.raises(InputError) as caught:
        pair.describe(long)
    message = str(caught.value)
    assert "--segment" not in message and f"pair.segments({str(long)!r})" in message, message
    assert "segment=True" in message
    _, result = next(pair.describe_many([long]))
    assert "pair.segments(" in result.error and result.error_kind == "too_long" and result.retry is False
    cli = CliRunner().invoke(app, ["describe", str(long)])
    assert cli.exit_code == 2 and "add --segment" in cli.stderr, cli.output


def test_dir_of_a_result_lists_its_fields(pair):
    """Issue 44: the record's fields are attributes (`result.cloud_calls`), but dir() and tab
    completion did not show them."""
    result = pair.describe(SAMPLE, max_new_tokens=8)
    names = dir(result)
    assert set(result.record) <= set(names), sorted(set(result.record) - set(names))
    assert {"description", "cloud_calls", "record", "events", "token_ids"} <= set(names)
    assert all(getattr(result, name) == result.record[name] for name in result.record)
