"""audio.load_audio: the formats and shapes it accepts, and every kind of bad input it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import SR, bad_corpus, tone, write_clip

from specdec_cli.audio import MIN_SECONDS, audio_suffixes, load_audio
from specdec_cli.errors import InputError

MAX_S = 30.0


@pytest.mark.parametrize(
    ("name", "subtype"),
    [("int16.wav", "PCM_16"), ("int24.wav", "PCM_24"), ("float32.wav", "FLOAT"), ("clip.flac", None),
     ("clip.ogg", None)],
)
def test_accepts_common_formats(tmp_path, name, subtype):
    path = write_clip(tmp_path / name, seconds=0.5, subtype=subtype)
    audio = load_audio(path, SR, MAX_S)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - SR // 2) <= 1
    assert 0.2 < np.abs(audio).max() < 0.45


@pytest.mark.skipif(".mp3" not in audio_suffixes(), reason="libsndfile without MP3")
def test_accepts_mp3(tmp_path):
    path = tmp_path / "clip.mp3"
    sf.write(str(path), tone(0.5), SR, format="MP3")
    audio = load_audio(path, SR, MAX_S)
    assert abs(len(audio) - SR // 2) < SR // 20  # the codec may pad a frame


def test_stereo_any_rate_is_downmixed_and_resampled(tmp_path):
    path = write_clip(tmp_path / "stereo.wav", seconds=0.5, sr=44100, channels=2)
    audio = load_audio(path, SR, MAX_S)
    assert audio.ndim == 1 and abs(len(audio) - SR // 2) <= 2


def test_non_ascii_file_name(tmp_path):
    path = write_clip(tmp_path / "说话人 01 — é.wav", seconds=0.3)
    assert len(load_audio(path, SR, MAX_S)) > 0


def test_volume_is_kept(tmp_path):
    """No loudness normalisation: a quieter recording stays quieter (volume is an attribute)."""
    loud = load_audio(write_clip(tmp_path / "loud.wav", amplitude=0.5), SR, MAX_S)
    quiet = load_audio(write_clip(tmp_path / "quiet.wav", amplitude=0.05), SR, MAX_S)
    assert np.abs(loud).max() / np.abs(quiet).max() == pytest.approx(10, rel=0.05)


def test_shortest_clip_is_accepted(tmp_path):
    audio = load_audio(write_clip(tmp_path / "min.wav", seconds=MIN_SECONDS), SR, MAX_S)
    assert len(audio) == int(SR * MIN_SECONDS)


def test_quiet_but_not_silent_is_accepted(tmp_path):
    """-50 dBFS is quiet speech, not silence."""
    assert len(load_audio(write_clip(tmp_path / "hush.wav", amplitude=0.003), SR, MAX_S)) > 0


@pytest.mark.parametrize("kind", ["empty", "not_audio", "too_short", "nan", "inf", "too_long", "silent", "no_samples"])
def test_bad_files_are_refused_with_one_line(tmp_path, kind):
    path, phrase = bad_corpus(tmp_path)[kind]
    with pytest.raises(InputError) as info:
        load_audio(path, SR, MAX_S)
    assert info.value.exit_code == 2
    assert phrase in info.value.message
    assert "\n" not in info.value.message
    assert str(path) in info.value.message


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_audio(tmp_path / "nope.wav", SR, MAX_S)
    with pytest.raises(InputError, match="is a directory.*specdec batch"):
        load_audio(tmp_path, SR, MAX_S)


def test_suffixes_cover_the_issue_formats():
    assert {".wav", ".flac", ".ogg"} <= set(audio_suffixes())
