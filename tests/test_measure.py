"""The demo labels are measured from the audio (demo contract v3): measure.py against signals whose
pitch, syllables, pauses and level are known by construction, the cut points against the contract's
gaps, and the command that labels a folder."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("parselmouth")

from specdec_cli.demo.measure import (  # noqa: E402
    Measures,
    band,
    cut_points,
    emotion_of,
    labels_of,
    measure,
    semitones,
)

RATE = 16_000


def vowel(f0: float, seconds: float, amp: float = 0.3) -> np.ndarray:
    """A voiced syllable nucleus: a harmonic tone at f0 with a raised-cosine envelope (one
    intensity peak, falling by far more than 2 dB at both ends)."""
    t = np.arange(int(seconds * RATE)) / RATE
    tone = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 6))
    env = 0.5 - 0.5 * np.cos(2 * np.pi * t / seconds)
    return (amp * env * tone / 1.5).astype(np.float32)


def utterance(f0: float, syllables: int, gaps_s: dict[int, float] | None = None, amp: float = 0.3,
              syllable_s: float = 0.2) -> np.ndarray:
    """`syllables` nuclei back to back, a silence of gaps_s[k] after syllable k, 0.3 s of silence
    around the whole."""
    pieces = [np.zeros(int(0.3 * RATE), np.float32)]
    for k in range(syllables):
        pieces.append(vowel(f0, syllable_s, amp))
        if gaps_s and k in gaps_s:
            pieces.append(np.zeros(int(gaps_s[k] * RATE), np.float32))
    pieces.append(np.zeros(int(0.3 * RATE), np.float32))
    return np.concatenate(pieces)


def test_pitch_is_the_median_f0_of_the_voiced_frames():
    m = measure(utterance(150.0, 8), RATE)
    assert m.f0_hz == pytest.approx(150.0, rel=0.01)
    # semitones from the gender's reference, as the contract defines them (男 120 Hz, 女 220 Hz)
    assert semitones(m.f0_hz, "男声") == pytest.approx(12 * math.log2(150 / 120), abs=0.15)
    assert semitones(m.f0_hz, "女声") == pytest.approx(12 * math.log2(150 / 220), abs=0.15)


@pytest.mark.parametrize("n", [4, 9, 15])
def test_every_syllable_nucleus_is_counted_and_rate_is_per_second_of_phonation(n):
    m = measure(utterance(180.0, n), RATE)
    assert m.syllables == n
    # no pause: phonation is the speech itself, n syllables of 0.2 s
    assert m.phonation_s == pytest.approx(0.2 * n, abs=0.15)
    assert m.rate == pytest.approx(m.syllables / m.phonation_s, rel=1e-3)
    assert m.pauses == 0 and m.pause_share == 0.0


def test_pauses_are_silences_of_at_least_250_ms_between_the_first_and_last_nucleus():
    x = utterance(180.0, 8, gaps_s={1: 0.5, 4: 0.4, 6: 0.15})  # the 150 ms gap is not a pause
    m = measure(x, RATE)
    assert m.syllables == 8
    assert m.pauses == 2
    # 0.9 s inserted, give or take the intensity window's smoothing and the neighbours' quiet ends
    assert 0.8 <= m.pause_s <= 1.1
    assert m.pause_share == pytest.approx(m.pause_s / m.span_s, rel=1e-3)
    # pauses are not phonation: the rate is the same as without them
    plain = measure(utterance(180.0, 8), RATE)
    assert m.rate == pytest.approx(plain.rate, rel=0.1)


def test_level_is_the_speech_frames_in_dbfs_and_moves_with_a_gain():
    x = utterance(200.0, 6)
    m = measure(x, RATE)
    louder = measure(x * 10 ** (6 / 20), RATE)
    assert louder.level_dbfs - m.level_dbfs == pytest.approx(6.0, abs=0.01)
    # only the sounding part counts: adding a second of silence leaves the level alone
    padded = measure(np.concatenate([x, np.zeros(RATE, np.float32)]), RATE)
    assert padded.level_dbfs == pytest.approx(m.level_dbfs, abs=0.3)
    # and it is the RMS of the speech: a steady tone of amplitude a reads 20 log10(a / sqrt 2)
    t = np.arange(RATE) / RATE
    tone = np.concatenate([np.zeros(RATE // 2), 0.2 * np.sin(2 * np.pi * 220 * t), np.zeros(RATE // 2)])
    assert measure(tone.astype(np.float32), RATE).level_dbfs == pytest.approx(20 * math.log10(0.2 / math.sqrt(2)), abs=0.5)


def test_silence_measures_nothing():
    m = measure(np.zeros(RATE, np.float32), RATE)
    assert m.f0_hz is None and m.rate is None and m.level_dbfs is None and m.syllables == 0
    labels, ambiguous = labels_of(m, "男声")
    assert labels == {"gender": "男声"}
    assert set(ambiguous) == {"rate", "pitch", "volume", "pauses", "emotion"}


def test_cut_points_leave_the_contracts_gaps_between_neighbouring_bands():
    bands = cut_points()["bands"]
    minimum = {"pitch": lambda lo, hi: hi - lo >= 1.0, "rate": lambda lo, hi: hi >= 1.1 * lo,
               "volume": lambda lo, hi: hi - lo >= 3.0, "pauses": lambda lo, hi: hi > lo}
    for attr, spec in bands.items():
        intervals = list(spec["bands"].values())
        for (_, hi), (lo2, _) in zip(intervals, intervals[1:], strict=False):
            assert minimum[attr](hi, lo2), (attr, hi, lo2)
    # pitch's middle band is centred on the reference
    lo, hi = bands["pitch"]["bands"]["音调适中"]
    assert lo == -hi


def test_a_value_in_a_gap_is_ambiguous_and_the_bounds_are_inclusive():
    spec = cut_points()["bands"]["rate"]["bands"]
    (_, slow_hi), (mid_lo, mid_hi) = spec["语速较慢"], spec["语速适中"]
    assert band("rate", slow_hi) == "语速较慢"
    assert band("rate", mid_lo) == "语速适中"
    assert band("rate", (slow_hi + mid_lo) / 2) is None
    assert band("rate", mid_hi + 1e-6) is None or band("rate", mid_hi + 1e-6) == "语速较快"
    assert band("rate", None) is None


def test_emotion_is_derived_from_the_measured_rate_and_pitch():
    assert emotion_of("语速较快", "音调偏高") == "情绪激动"
    assert emotion_of("语速较慢", "音调偏低") == "情绪低落"
    assert emotion_of("语速较快", "音调偏低") == "情绪平静"
    assert emotion_of(None, "音调偏高") is None


def test_without_a_gender_pitch_and_emotion_are_left_out_not_ambiguous():
    m = Measures(seconds=3.0, f0_hz=180.0, syllables=12, phonation_s=2.5, rate=4.8, level_dbfs=-25.0,
                 pauses=0, pause_s=0.0, span_s=2.2, pause_share=0.0)
    labels, ambiguous = labels_of(m, None)
    assert labels == {"rate": "语速适中", "volume": "音量适中", "pauses": "停顿较少"}
    assert ambiguous == []
    # the same F0 is high for a man and low for a woman: pitch is relative to the gender
    assert labels_of(m, "男声")[0]["pitch"] == "音调偏高"
    assert labels_of(m, "女声")[0]["pitch"] == "音调偏低"


def test_the_command_labels_a_folder(tmp_path):
    sf.write(tmp_path / "a.wav", utterance(230.0, 10), RATE)
    sub = tmp_path / "more"
    sub.mkdir()
    sf.write(sub / "b.flac", utterance(230.0, 5, gaps_s={2: 0.6}, amp=0.05), RATE)
    done = subprocess.run([sys.executable, "-m", "specdec_cli.demo.measure", str(tmp_path), "--gender", "female"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in (tmp_path / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    by = {x["file"]: x for x in lines}
    assert set(by) == {"a.wav", "more/b.flac"}
    assert by["a.wav"]["labels"]["gender"] == "女声"
    assert by["more/b.flac"]["measures"]["pauses"] == 1
    assert by["more/b.flac"]["labels"]["pauses"] == "停顿较多"
    assert by["a.wav"]["measures"]["syllables"] == 10


def test_the_command_refuses_a_missing_folder_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specdec_cli.demo.measure", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "not a folder" in done.stderr


def test_without_praat_the_message_names_the_projects_extra(monkeypatch):
    """Issue 51/52: the labeller is in the measure extra; its message says how to install that."""
    from specdec_cli.demo import measure as measure_module

    monkeypatch.setitem(sys.modules, "parselmouth", None)  # as if not installed: its import fails
    with pytest.raises(SystemExit) as exc:
        measure_module.measure(np.zeros(RATE, np.float32), RATE)
    assert str(exc.value) == ("error: measuring needs praat-parselmouth, in specdec's measure extra: "
                              "pip install 'specdec-omni[measure]'")
