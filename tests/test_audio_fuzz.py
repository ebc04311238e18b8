"""Property tests of the CLI's audio decoding (issue 25), by hypothesis: any bytes given as a clip
— random, or a real WAV/FLAC/OGG/MP3 with bytes changed, cut or appended — are either a clip the
model can take (mono float32, finite, within the length limit) or an InputError with one line.
Never another exception. Both ways in: a file on disk and the clip's bytes (a Ray worker's)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import SR, tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_cli.audio import audio_suffixes, load_audio
from specdec_cli.errors import InputError

MAX_S = 2.0  # a short limit keeps each example cheap; the bound's logic does not depend on it
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _encoded(fmt: str, subtype: str | None, seconds: float, rate: int, channels: int) -> bytes:
    buf = io.BytesIO()
    x = tone(seconds, sr=rate, channels=channels)
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


SEEDS = [_encoded("WAV", "PCM_16", 0.5, SR, 1), _encoded("WAV", "FLOAT", 0.3, 8000, 2),
         _encoded("FLAC", "PCM_16", 0.5, SR, 1), _encoded("FLAC", "PCM_24", 3.0, 8000, 1),
         _encoded("OGG", "VORBIS", 0.5, SR, 1)]
if ".mp3" in audio_suffixes():
    SEEDS += [_encoded("MP3", None, 0.5, SR, 1), _encoded("MP3", None, 3.0, SR, 2)]


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A real file with some bytes overwritten, then maybe cut short or extended."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 8))):
        at = draw(st.integers(0, len(data) - 1))
        # the header's bytes most often: that is where lengths, rates and counts live
        at = at % 64 if draw(st.booleans()) else at
        data[at] = draw(st.integers(0, 255))
    cut = draw(st.one_of(st.none(), st.integers(1, len(data))))
    tail = draw(st.binary(max_size=64))
    return bytes(data[:cut]) + tail


CLIPS = st.one_of(st.binary(min_size=1, max_size=2048), damaged())


def _check(clip: bytes, load) -> None:
    try:
        audio = load(clip)
    except InputError as exc:
        assert exc.exit_code == 2 and exc.message and "\n" not in exc.message and "\r" not in exc.message
        return
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert 0 < len(audio) <= MAX_S * SR + 1 and np.isfinite(audio).all()


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".mp3"])
@FUZZ
@given(clip=CLIPS)
def test_any_file_is_a_clip_or_one_line(tmp_path: Path, suffix: str, clip: bytes) -> None:
    path = tmp_path / f"clip{suffix}"
    path.write_bytes(clip)
    _check(clip, lambda _: load_audio(path, SR, MAX_S))


@FUZZ
@given(clip=CLIPS)
def test_any_bytes_are_a_clip_or_one_line(clip: bytes) -> None:
    _check(clip, lambda data: load_audio(Path("shipped.wav"), SR, MAX_S, data=data))
