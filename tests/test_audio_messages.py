"""audio.py's refusals word for word (the one line a user reads), the formats hint and libsndfile's
reason as the messages quote them, the silence threshold at its edges, the downmix against a
hand-computed mean, and the length check after decoding for headers that do not say the length.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import soundfile as sf
from audio_files import flac_with_total
from cli_helpers import SR, tone, write_clip

from specdec_cli import audio
from specdec_cli.audio import load_audio
from specdec_cli.errors import InputError

MAX_S = 30.0


def refused(path, max_seconds: float = MAX_S) -> str:
    with pytest.raises(InputError) as info:
        load_audio(path, SR, max_seconds)
    assert info.value.exit_code == 2
    return info.value.message


@pytest.fixture
def hint() -> str:
    """The formats hint for this libsndfile, spelled out by hand."""
    names = ["WAV", "FLAC", "OGG", *(["MP3"] if "MP3" in sf.available_formats() else []),
             *(["M4A"] if importlib.util.find_spec("av") else [])]  # M4A: PyAV's ffmpeg
    return f"{', '.join(names[:-1])} or {names[-1]}"


def test_each_refusal_word_for_word(tmp_path, hint):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    assert refused(empty) == f"{empty} is empty (0 bytes); give a {hint} file"
    text = tmp_path / "notes.wav"
    text.write_text("not audio\n" * 20)
    assert refused(text) == f"cannot decode {text} as audio (Format not recognised); give a {hint} file"
    short = write_clip(tmp_path / "short.wav", seconds=0.05)
    assert refused(short) == f"{short} is 0.050 s long; give a clip of at least 0.1 s"
    long = write_clip(tmp_path / "long.wav", seconds=31, sr=1000)
    assert refused(long) == (f"{long} is 31.0 s long; the model takes at most 30 s per clip: add --segment to cut "
                             "it at pauses into segments of at most 30 s")
    silent = write_clip(tmp_path / "silent.wav", amplitude=0.0)
    assert refused(silent) == (f"{silent} is silent (peak below -60 dBFS); nothing to describe: check the "
                               "recording")
    nothing = tmp_path / "none.wav"
    sf.write(str(nothing), np.zeros(0, dtype=np.float32), SR)
    assert refused(nothing) == f"{nothing} holds no audio samples; give a clip of at least 0.1 s"
    nan = tone(0.5)
    nan[3] = np.nan
    sf.write(str(tmp_path / "nan.wav"), nan, SR, subtype="FLOAT")
    assert refused(tmp_path / "nan.wav") == f"{tmp_path / 'nan.wav'} contains NaN or infinite samples; re-export the audio"
    assert refused(tmp_path / "nope.wav") == f"no such file: {tmp_path / 'nope.wav'}; check the path"
    assert refused(tmp_path) == (f"{tmp_path} is a directory; give one audio file (use `specdec batch {tmp_path} --out "
                                 "results.jsonl` for a folder)")


@pytest.mark.parametrize(("suffixes", "expected"), [
    ((".wav",), "WAV"),
    ((".wav", ".flac"), "WAV or FLAC"),
    ((".wav", ".flac", ".ogg", ".mp3"), "WAV, FLAC, OGG or MP3"),
])
def test_formats_hint_lists_what_libsndfile_decodes(monkeypatch, suffixes, expected):
    monkeypatch.setattr(audio, "audio_suffixes", lambda: suffixes)
    monkeypatch.setattr(audio, "_has_av", lambda: False)
    assert audio._formats_hint() == expected
    monkeypatch.setattr(audio, "_has_av", lambda: True)
    assert audio._formats_hint() == (expected.replace(" or ", ", ") + " or M4A")


@pytest.mark.parametrize(("exc", "expected"), [
    (RuntimeError("Error opening 'x.wav': Format not recognised."), "Format not recognised"),
    (RuntimeError("Internal psf_fseek() failed."), "Internal psf_fseek() failed"),
    (RuntimeError("first: a: b.\nsecond line"), "b"),
    (RuntimeError("  "), "RuntimeError"),
    (RuntimeError("Error: no codec for MAX."), "no codec for MAX"),
    (OSError(), "OSError"),
])
def test_reason_is_libsndfiles_last_words_of_the_first_line(exc, expected):
    assert audio._reason(exc) == expected


def test_silence_threshold_is_minus_60_dbfs(tmp_path):
    """Peak 0.0009 (-60.9 dBFS) is silence; 0.0012 (-58.4 dBFS) is a (very) quiet clip."""
    below = tmp_path / "below.wav"
    sf.write(str(below), np.full(SR, 0.0009, dtype=np.float32), SR, subtype="FLOAT")
    assert "is silent" in refused(below)
    above = tmp_path / "above.wav"
    sf.write(str(above), np.full(SR, 0.0012, dtype=np.float32), SR, subtype="FLOAT")
    assert len(load_audio(above, SR, MAX_S)) == SR


def test_stereo_is_the_mean_of_its_channels(tmp_path):
    """Channels that differ (left 0.5 x, right 0.1 x): the model hears 0.3 x, not one channel."""
    x = tone(0.5)
    path = tmp_path / "stereo.wav"
    sf.write(str(path), np.stack([0.5 * x, 0.1 * x], axis=1), SR, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(path, SR, MAX_S), 0.3 * x, atol=1e-7)


def test_length_is_checked_again_after_decoding(tmp_path):
    """A header that does not say the length (a FLAC written to a pipe): judged by what decodes."""
    path = tmp_path / "clip.flac"
    sf.write(str(path), tone(31, sr=1000), 1000, format="FLAC")
    path.write_bytes(flac_with_total(path.read_bytes(), 0))
    assert refused(path) == (f"{path} is over 30 s long; the model takes at most 30 s per clip: add --segment to "
                             "cut it at pauses into segments of at most 30 s")


def test_a_read_failure_after_a_good_header(tmp_path, monkeypatch, hint):
    path = write_clip(tmp_path / "clip.wav", seconds=1.0)

    def fail(*args, **kwargs):
        raise RuntimeError("Error reading: Internal psf_fseek() failed.")

    monkeypatch.setattr(sf.SoundFile, "read", fail)
    assert refused(path) == f"cannot decode {path} as audio (Internal psf_fseek() failed); give a {hint} file"


# -- waveforms and bytes given in memory (the Python API; Ray workers that cannot see the disk) -------

def test_a_waveform_is_prepared_as_the_file_holding_it(tmp_path):
    x = tone(0.5)
    path = tmp_path / "clip.wav"
    sf.write(str(path), x, SR, subtype="FLOAT")
    from_file = load_audio(path, SR, MAX_S)
    np.testing.assert_array_equal(audio.prepare_waveform(x.astype(np.float64), SR, SR, MAX_S), from_file)
    np.testing.assert_array_equal(load_audio(path, SR, MAX_S, data=path.read_bytes()), from_file)
    stereo = (0.3 * np.random.default_rng(0).standard_normal((len(x), 3))).astype(np.float32)  # 3 channels
    sf.write(str(tmp_path / "stereo.wav"), stereo, SR, subtype="FLOAT")
    # float32 arithmetic, as for the file (a float64 mean rounds differently in the last bit)
    np.testing.assert_array_equal(audio.prepare_waveform(stereo.astype(np.float64), SR, SR, MAX_S),
                                  load_audio(tmp_path / "stereo.wav", SR, MAX_S))
    assert len(audio.prepare_waveform(x, 2 * SR, SR, MAX_S)) == len(x) // 2  # resampled to the model's rate


def test_a_bad_waveform_is_refused_with_its_name():
    with pytest.raises(InputError) as info:
        audio.prepare_waveform(np.zeros((2, 3, 4)), SR, SR, MAX_S)
    assert info.value.message == ("<waveform>: give samples as [frames], [frames, channels] or [channels, frames] "
                                  "with a positive rate, got shape (2, 3, 4) at 16000 Hz")
    with pytest.raises(InputError) as info:
        audio.prepare_waveform(tone(0.5), 0, SR, MAX_S, name="mic")
    assert info.value.message == ("mic: give samples as [frames], [frames, channels] or [channels, frames] with "
                                  "a positive rate, got shape (8000,) at 0 Hz")
    with pytest.raises(InputError) as info:  # no header here: the length is only known from the samples
        audio.prepare_waveform(tone(31, sr=1000), 1000, SR, MAX_S, name="mic")
    # the API's terms (issue 44): its caller has Pair.segments, not the command line's --segment
    assert info.value.message == ("mic is 31.0 s long; the model takes at most 30 s per clip: cut it at pauses "
                                  "with pair.segments(samples, rate=1000) and describe each piece")


def _pcm_wav(path, ints: np.ndarray, width: int) -> None:
    """A mono PCM WAV holding exactly these integer samples, by the standard library's wave module."""
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(width)
        w.setframerate(SR)
        w.writeframes(ints.astype(ints.dtype.newbyteorder("<")).tobytes())


@pytest.mark.parametrize("dtype", ["int16", "int32", "uint8"])
def test_integer_samples_are_scaled_as_a_pcm_file_is_read(tmp_path, dtype):
    """Issue 44: int16 samples were taken as floats (peaks near 10,000) and described as noise. The
    oracle: libsndfile reading a WAV that holds the same integers."""
    info = np.iinfo(dtype)
    x = tone(0.5)
    centre = 0 if info.min < 0 else (info.max + 1) // 2
    ints = (np.round(x * (info.max - centre)) + centre).astype(dtype)
    path = tmp_path / f"{dtype}.wav"
    _pcm_wav(path, ints, np.dtype(dtype).itemsize)
    ours = audio.prepare_waveform(ints, SR, SR, MAX_S)
    np.testing.assert_allclose(ours, load_audio(path, SR, MAX_S), rtol=0, atol=1e-7)
    np.testing.assert_allclose(ours, x, rtol=0, atol=1 / 128)  # full scale 1.0, as the tone was made


def test_a_channels_first_array_is_downmixed_as_a_file_is():
    """librosa's and torchaudio's layout, [channels, frames], was read as [frames, channels]: 2 frames,
    "0.000 s long". The oracle: the same samples given frames-first."""
    stereo = (0.3 * np.random.default_rng(1).standard_normal((SR // 2, 2))).astype(np.float32)
    np.testing.assert_array_equal(audio.prepare_waveform(stereo.T, SR, SR, MAX_S),
                                  audio.prepare_waveform(stereo, SR, SR, MAX_S))
    assert audio.prepare_waveform(stereo.T, SR, SR, MAX_S).shape == (SR // 2,)


def test_samples_that_are_not_numbers_are_refused():
    with pytest.raises(InputError) as info:
        audio.prepare_waveform(np.ones(SR, dtype=bool), SR, SR, MAX_S)
    assert info.value.message == ("<waveform>: samples of dtype bool are not audio; give floats (full scale 1.0) "
                                  "or integer PCM (int16, int32, uint8)")


def test_empty_bytes_are_refused_like_an_empty_file(tmp_path, hint):
    with pytest.raises(InputError) as info:
        load_audio(tmp_path / "remote.wav", SR, MAX_S, data=b"")
    assert info.value.message == f"{tmp_path / 'remote.wav'} is empty (0 bytes); give a {hint} file"


def test_bytes_are_read_not_the_path_they_are_named_by(tmp_path):
    """With data=, the path only names the clip (a Ray worker cannot see the driver's disk)."""
    path = write_clip(tmp_path / "clip.wav", seconds=0.5)
    elsewhere = tmp_path / "not-here" / "clip.wav"
    np.testing.assert_array_equal(load_audio(elsewhere, SR, MAX_S, data=path.read_bytes()),
                                  load_audio(path, SR, MAX_S))


def test_exactly_the_longest_clip_is_accepted(tmp_path):
    assert len(load_audio(write_clip(tmp_path / "30s.wav", seconds=30, sr=1000), SR, MAX_S)) == 30 * SR
    assert len(audio.prepare_waveform(tone(30, sr=1000), 1000, SR, MAX_S)) == 30 * SR


def test_stat_failures_and_permission_in_process(tmp_path, monkeypatch):
    long = tmp_path / ("a" * 300 + ".wav")
    assert refused(long) == f"cannot read {long}: File name too long"
    clip = write_clip(tmp_path / "clip.wav", seconds=0.5)
    monkeypatch.setattr(audio.os, "access", lambda path, mode: False)  # root reads anything: stand in
    assert refused(clip) == f"cannot read {clip}: permission denied"
