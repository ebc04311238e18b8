"""Options that cannot apply are refused in one line (issue 52, point 6): `--depth` and `--upload`
without a remote cloud (they did nothing, silently), from the command line and the API; and a
stereo file whose channels differ much (a voice on each) is said once, not mixed without a word."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import FAST, SR, tone
from typer.testing import CliRunner

from specdec_cli.audio import ChannelsDiffer, load_audio, mono_blocks, recording_info
from specdec_cli.commands.app import app
from specdec_cli.errors import InputError

pytest_plugins = ["cli_fixtures"]


@pytest.mark.parametrize("flag, value", [("--depth", "auto"), ("--depth", "2"), ("--upload", "eager")])
@pytest.mark.parametrize("command", ["describe", "batch"])
def test_a_remote_only_option_without_a_remote_cloud_is_refused(tmp_path, models, flag, value, command):
    clip = tmp_path / "in" / "a.wav"
    clip.parent.mkdir()
    sf.write(str(clip), tone(1.0), SR)
    where = [str(clip)] if command == "describe" else [str(clip.parent), "--out", str(tmp_path / "r.jsonl")]
    result = CliRunner().invoke(app, [command, *where, *models, *FAST, flag, value])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"error: {flag} goes with --cloud http://…; with the cloud in this process "
                     f"{'no clip goes up' if flag == '--upload' else 'a verdict comes back at once, with nothing to overlap'}"
                     f": leave {flag} out"], lines


def test_the_api_refuses_a_depth_without_a_remote_cloud(tiny_pair):
    from specdec import Pair

    with pytest.raises(InputError, match="--depth goes with --cloud"):
        Pair(*tiny_pair, depth="auto")


@pytest.fixture(scope="module")
def voices():
    from pathlib import Path

    samples = Path(__file__).resolve().parents[1] / "samples"
    a = sf.read(str(samples / "f_fast_low.wav"), dtype="float32")[0]
    b = sf.read(str(samples / "m_slow_low.wav"), dtype="float32")[0]
    n = min(len(a), len(b))
    return a[:n], b[:n]


def notes(path, **kw) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_audio(path, SR, 30.0, **kw)
    return [str(w.message) for w in caught if issubclass(w.category, ChannelsDiffer)]


def test_a_voice_on_each_channel_is_noted_once(tmp_path, voices):
    a, b = voices
    two = tmp_path / "two_voices.wav"
    sf.write(str(two), np.stack([a, b], axis=1), SR)
    said = notes(two)
    assert len(said) == 1 and "two_voices.wav: its 2 channels differ much" in said[0], said
    left = tmp_path / "left_only.wav"
    sf.write(str(left), np.stack([a, np.zeros_like(a)], axis=1), SR)
    assert len(notes(left)) == 1
    # The controls: one voice in both channels, at different levels (a panned mono), is not noted.
    panned = tmp_path / "panned.wav"
    sf.write(str(panned), np.stack([a, 0.6 * a], axis=1), SR)
    assert notes(panned) == []
    # --segment's reading: once per recording, however many blocks.
    long = tmp_path / "long.wav"
    sf.write(str(long), np.tile(np.stack([a, b], axis=1), (8, 1)), SR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        blocks = list(mono_blocks(long, None, recording_info(long), block_frames=SR))
    assert len(blocks) > 8 and sum(issubclass(w.category, ChannelsDiffer) for w in caught) == 1
