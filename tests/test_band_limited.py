"""Issue 51, item 6: a band-limited clip (nearly nothing above 4 kHz: a telephone line, an 8 kHz
recording) says so in its record (`band_limited: true`), and describe and batch say it once per run,
with the count, not once per clip.

The band-limited copies are made here the way the issue made them (`sox in.wav -r 8000 out.wav
sinc 300-3400`), with scipy's filter design instead of sox: a 300-3400 Hz linear-phase band-pass,
then resampled to 8 kHz (or kept at 16 kHz: a telephone recording stored at the full rate)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import run_specdec
from scipy import signal

from specdec_cli.audio import band_limited, load_audio

pytest_plugins = ["cli_fixtures"]

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SR = 16_000


def telephone(x: np.ndarray, rate: int = SR, out_rate: int = 8000) -> np.ndarray:
    """300-3400 Hz (a 255-tap FIR band-pass, stop band below 200 and above 3600 Hz), at `out_rate`."""
    taps = signal.firwin(255, [300, 3400], pass_zero=False, fs=rate)
    y = signal.lfilter(taps, 1.0, x)
    return signal.resample_poly(y, out_rate, rate) if out_rate != rate else y


def write_telephone(src: Path, out: Path, out_rate: int = 8000) -> Path:
    x, rate = sf.read(src, dtype="float64")
    sf.write(out, telephone(x, rate, out_rate).astype(np.float32), out_rate, subtype="FLOAT")
    return out


def _labelled_band_limited() -> dict[str, bool]:
    """Each sample's `band_limited`, as the corpus that wrote it recorded it (absent: wideband)."""
    rows = [json.loads(x) for x in (SAMPLES / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    return {r["file"]: bool(r.get("band_limited")) for r in rows}


def test_the_telephone_sample_is_band_limited_and_the_others_are_not():
    """samples/f_telephone.wav (v5's: a G.711 line at 8 kHz) is heard as band-limited; the nine
    wideband samples are not, as their labels say."""
    said = _labelled_band_limited()
    assert said["f_telephone.wav"] and sum(said.values()) == 1
    for name, narrow in said.items():
        assert band_limited(load_audio(SAMPLES / name, SR, 30.0), SR) == narrow, name


@pytest.mark.parametrize("sample", sorted(f for f, narrow in _labelled_band_limited().items() if not narrow))
def test_a_telephone_copy_is_band_limited_and_the_sample_is_not(sample, tmp_path):
    wide = load_audio(SAMPLES / sample, SR, 30.0)
    assert not band_limited(wide, SR)
    for rate in (8000, SR):  # at 8 kHz, and the same band kept at 16 kHz (no low-rate warning for it)
        narrow = load_audio(write_telephone(SAMPLES / sample, tmp_path / f"tel{rate}.wav", rate), SR, 30.0)
        assert band_limited(narrow, SR), rate


def test_the_criterion_is_the_share_of_energy_above_4_khz():
    """White noise holds half its energy above 4 kHz at 16 kHz; low-passed at 3.4 kHz, nothing; a
    tone at 1 kHz plus one at 5 kHz 40 dB down (0.01 % of the energy) is just above the -45 dB line,
    60 dB down (0.0001 %) under it."""
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(SR * 2)
    assert not band_limited(noise, SR)
    assert band_limited(signal.lfilter(signal.firwin(255, 3400, fs=SR), 1.0, noise), SR)
    t = np.arange(SR * 2) / SR
    low = np.sin(2 * np.pi * 1000 * t)
    assert not band_limited(low + 0.01 * np.sin(2 * np.pi * 5000 * t), SR)   # -40 dB above 4 kHz
    assert band_limited(low + 0.001 * np.sin(2 * np.pi * 5000 * t), SR)      # -60 dB
    assert band_limited(noise[:8000], 8000)  # an 8 kHz rate holds nothing above 4 kHz


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """Three band-limited clips (two at 8 kHz, one at 16 kHz) and one wideband sample."""
    folder = tmp_path_factory.mktemp("phone")
    write_telephone(SAMPLES / "f_fast_high.wav", folder / "a_tel8k.wav")
    write_telephone(SAMPLES / "f_mid_mid_loud.wav", folder / "b_tel8k.wav")
    write_telephone(SAMPLES / "m_slow_low.wav", folder / "c_tel16k.wav", SR)
    sf.write(folder / "d_wide.wav", *sf.read(SAMPLES / "m_mid_high.wav"))
    return folder


def _notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("note:")]


@pytest.mark.spawns
def test_batch_records_say_band_limited_and_the_run_says_it_once(mixed, models, tmp_path):
    out = tmp_path / "r.jsonl"
    done = run_specdec("batch", str(mixed), "--out", str(out), "--max-new-tokens", "8", *models, timeout=600)
    assert done.returncode == 0, done.stderr
    records = {Path(r["file"]).name: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert {f: r["band_limited"] for f, r in records.items()} == {
        "a_tel8k.wav": True, "b_tel8k.wav": True, "c_tel16k.wav": True, "d_wide.wav": False}
    [note] = _notes(done.stderr)  # once per run (it was one warning per 8 kHz clip, none for the 16 kHz one)
    assert note.startswith("note: 3 of 4 clips are band-limited (nearly nothing above 4 kHz")
    assert "2 were recorded below the models' rate" in note
    assert "recorded at 8000 Hz" not in done.stderr


@pytest.mark.spawns
def test_describe_of_several_clips_says_it_once(mixed, models):
    clips = sorted(str(p) for p in mixed.glob("*.wav"))
    done = run_specdec("describe", *clips, "--json", "--max-new-tokens", "8", *models, timeout=600)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["band_limited"] for line in done.stdout.splitlines()] == [True, True, True, False]
    [note] = _notes(done.stderr)
    assert note.startswith("note: 3 of 4 clips are band-limited") and "2 were recorded below" in note
    assert "warning:" not in done.stderr
    one = run_specdec("describe", clips[2], "--max-new-tokens", "8", *models, timeout=600)  # 16 kHz, band-limited
    assert one.returncode == 0, one.stderr
    assert _notes(one.stderr) == [f"note: {clips[2]} is band-limited (nearly nothing above 4 kHz, as on a telephone "
                                  "line; band_limited: true in its record): the models may mishear such voices (the "
                                  "demo pair, trained through telephone lines, still states their pitch less well)"]


def test_a_telephone_clip_cut_off_mid_sound_is_still_band_limited():
    """The FFT treats a clip as periodic, so a recording cut off mid-word (its last sample far from
    its first) adds a step whose energy spreads over every frequency: computed plainly (the oracle
    below: numpy's periodogram of the whole clip, no fades) a telephone-band copy cut at its loudest
    sample puts more than -45 dB above 4 kHz and would be called wideband, as samples/f_telephone.wav
    was. The fades band_limited applies keep it band-limited; the wideband sample stays wideband."""
    x, rate = sf.read(SAMPLES / "f_fast_high.wav", dtype="float64")
    narrow = telephone(x, rate, SR)
    cut = narrow[: int(np.argmax(np.abs(narrow))) + 1]  # ends at its loudest sample
    power = np.abs(np.fft.rfft(cut - cut.mean())) ** 2
    plain_db = 10 * np.log10(power[np.fft.rfftfreq(len(cut), 1 / SR) >= 4000].sum() / power.sum())
    assert plain_db > -45
    assert band_limited(cut, SR)
    assert not band_limited(x[: len(cut)], SR)
