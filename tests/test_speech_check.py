"""A clip without speech is not described (issue 52, point 1): the speech check (speech.py, Silero
VAD) refuses tones, a dial tone, music, noise and laughter-like bursts as an input error that says
how much speech it found; every bundled sample, short real words and speech over music pass; the
API, `describe`, `batch` and `--segment` all apply it.

The oracle for "speech" and "not speech" is how the clips were made: numpy synthesis without a voice
(bench/vad.py's signals) against recordings of voices (samples/, espeak-ng)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from cli_helpers import FAST, SR, bench_module
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.errors import InputError, error_kind
from specdec_cli.speech import MIN_SPEECH_S, NoSpeech, check_speech, speech_seconds

pytest_plugins = ["cli_fixtures"]

vad = bench_module("vad")
NO_SPEECH = vad.no_speech()


@pytest.mark.parametrize("name", list(NO_SPEECH))
def test_no_speech_is_refused_with_how_much_was_found(name):
    clip = NO_SPEECH[name]
    with pytest.raises(NoSpeech) as caught:
        check_speech(clip, SR, f"<{name}>")
    message = caught.value.message
    found = speech_seconds(clip, SR)
    assert found < MIN_SPEECH_S
    assert f"found {found:.2f} s of speech in its {len(clip) / SR:.2f} s" in message
    assert "\n" not in message and "give a recording of someone speaking" in message
    assert error_kind(caught.value) == "input"


def test_speech_passes_short_words_samples_and_speech_over_music():
    clips = vad.speech()
    assert sum(name.startswith("sample ") for name in clips) >= 9  # every bundled sample
    threads = torch.get_num_threads()
    for name, clip in clips.items():
        check_speech(clip, SR, name)  # no NoSpeech
    # The detector runs on one thread and gives the process its own count back.
    assert torch.get_num_threads() == threads


def test_short_espeak_words_pass():
    said = {text: vad.espeak(text, voice, speed) for text, voice, speed in vad.WORDS}
    if any(x is None for x in said.values()):
        pytest.skip("needs espeak-ng")
    for text, clip in said.items():
        assert 0.3 < len(clip) / SR < 1.5, text
        check_speech(clip, SR, text)


def test_a_clip_at_another_rate_is_heard_at_16k():
    clip = vad.read16k(vad.REPO / "samples" / "m_mid_high.wav")
    import soxr

    check_speech(soxr.resample(clip, SR, 44100).astype(np.float32), 44100, "44.1 kHz")
    with pytest.raises(NoSpeech):
        check_speech(soxr.resample(NO_SPEECH["dial tone 350+440 Hz 3 s"], SR, 8000), 8000, "8 kHz")


# -- every way in -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("speechless")
    sf.write(str(root / "dial.wav"), NO_SPEECH["dial tone 350+440 Hz 3 s"], SR)
    sf.write(str(root / "chords.wav"), NO_SPEECH["chords 4 s"], SR)
    speech, _ = sf.read(str(vad.REPO / "samples" / "m_mid_high.wav"), dtype="float32")
    sf.write(str(root / "voice.wav"), speech, SR)
    return root


def test_describe_refuses_a_dial_tone_in_one_line(folder, models):
    result = CliRunner().invoke(app, ["describe", str(folder / "dial.wav"), *models, *FAST])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "dial.wav holds no speech to describe" in lines[0], result.output
    assert "found 0.00 s of speech" in lines[0] and "Traceback" not in result.output


def test_batch_records_the_refusal_and_describes_the_rest(folder, models, tmp_path):
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["batch", str(folder), "--out", str(out), *models, *FAST])
    assert result.exit_code == 1, result.output
    records = {r["file"].rsplit("/", 1)[-1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"dial.wav", "chords.wav", "voice.wav"}
    for name in ("dial.wav", "chords.wav"):
        assert records[name]["error_kind"] == "input" and "holds no speech" in records[name]["error"]
        assert records[name]["description"] is None
    assert records["voice.wav"]["error"] is None and records["voice.wav"]["description"]


def test_the_api_refuses_a_waveform_without_speech(tiny_pair):
    from specdec import Pair

    pair = Pair(*tiny_pair)
    with pytest.raises(InputError, match=r"<waveform> holds no speech to describe"):
        pair.describe(NO_SPEECH["melody 4 s"], rate=SR, max_new_tokens=4)
    speech, _ = sf.read(str(vad.REPO / "samples" / "m_mid_high.wav"), dtype="float32")
    assert pair.describe(speech, rate=SR, max_new_tokens=4).description is not None


def test_segment_cuts_where_it_hears_speech_and_leaves_music_out(tmp_path):
    """Chords, a voice, chords, a voice, chords: the segments kept hold the voices; the chords
    alone are left out, and a recording of chords alone is refused as holding no speech."""
    from specdec_cli.segments import open_recording

    music = np.resize(vad.chords(8), 14 * SR).astype(np.float32)
    voice, _ = sf.read(str(vad.REPO / "samples" / "f_fast_low.wav"), dtype="float32")
    parts = [music, voice, music, voice, music]
    sf.write(str(tmp_path / "show.wav"), np.concatenate(parts), SR)
    spans, at = [], 0
    for part in parts:
        spans.append((at, at + len(part)))
        at += len(part)
    voices = [spans[1], spans[3]]
    segments = open_recording(tmp_path / "show.wav", SR, 30.0).segments
    assert segments
    for s in segments:  # each segment kept overlaps a voice
        assert any(s.start < b and a < s.end for a, b in voices), (s, voices)
    for a, b in voices:  # and each voice is in a segment, nearly whole
        covered = sum(max(0, min(b, s.end) - max(a, s.start)) for s in segments)
        assert covered >= 0.9 * (b - a)
    sf.write(str(tmp_path / "music.wav"), np.concatenate([music, music, music]), SR)
    with pytest.raises(NoSpeech, match=r"music.wav holds no speech to describe"):
        open_recording(tmp_path / "music.wav", SR, 30.0)
