"""Demo pair v5's corpus (demo contract v4): every clip comes through a channel; rate, pitch and pauses
are the clean clip's measures, volume the clip's as heard; held-out clips keep ambiguous attributes."""

from __future__ import annotations

import json
import random
import shutil
import sys

import numpy as np
import pytest

from specdec_cli.demo import channel

RATE = 16_000
needs_sox = pytest.mark.skipif(shutil.which("sox") is None, reason="needs sox (make speech)")
SYNTHS = ("espeak-ng", "festival", "flite", "sox")
needs_synths = pytest.mark.skipif(any(shutil.which(t) is None for t in SYNTHS),
                                  reason="needs espeak-ng, festival, flite and sox (make speech)")


def speechlike(seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """A harmonic-rich signal with syllable-rate amplitude modulation and energy up to 8 kHz."""
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 200 + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 38))
    x = x * (0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)) + 0.02 * np.random.default_rng(seed).standard_normal(len(t))
    return (0.3 * x / np.max(np.abs(x))).astype(np.float32)


def high_band_share(y: np.ndarray) -> float:
    s = np.abs(np.fft.rfft(y.astype(np.float64))) ** 2
    f = np.fft.rfftfreq(len(y), 1 / RATE)
    return float(s[f > 4000].sum() / s.sum())


def test_draws_are_a_pure_function_of_the_random_stream_and_cover_every_family():
    a = [channel.draw(random.Random(f"s/{k}")) for k in range(400)]
    b = [channel.draw(random.Random(f"s/{k}")) for k in range(400)]
    assert a == b
    assert json.loads(json.dumps(a)) == a  # recorded in the corpus's clip lists as they are
    seen = {channel.family_of(s) for s in a}
    assert seen == set(channel.TRAIN_WEIGHTS)
    # clean stays one of the draws, and band-limited channels are a real share (the v4 failure)
    share = sum(channel.band_limited(s) for s in a) / len(a)
    assert 0.15 < share < 0.45, share
    assert 0.05 < sum(channel.family_of(s) == "clean" for s in a) / len(a) < 0.3


@needs_sox
@pytest.mark.parametrize("codec", channel.TELEPHONE_CODECS)
def test_a_telephone_line_leaves_nothing_above_4_khz_and_keeps_the_timing(codec):
    x = speechlike()
    assert high_band_share(x) > 0.01
    y = channel.apply(x, [{"op": "family", "name": "telephone"}, {"op": "telephone", "codec": codec}], 0.01)
    assert len(y) == len(x) and y.dtype == np.float32
    assert high_band_share(y) < 1e-3
    # the line delays nothing: the envelope lines up with the input's (cross-correlation peak at ~0)
    env = [np.convolve(np.abs(v), np.ones(160) / 160, "same") for v in (x, y)]
    lag = np.argmax(np.correlate(env[1] - env[1].mean(), env[0][800:-800] - env[0].mean(), "valid")) - 800
    assert abs(lag) < 80


@pytest.mark.parametrize(("name", "kbps"), [("opus", 8), ("opus", 24), ("mp3", 32), ("aac", 48)])
def test_a_codec_round_trip_keeps_length_and_alignment(name, kbps):
    pytest.importorskip("av")
    x = speechlike()
    y = channel.apply(x, [{"op": "family", "name": "codec"}, {"op": "codec", "codec": name, "kbps": kbps}], 0.01)
    assert len(y) == len(x)
    # the priming delay is cut: the output correlates best with the input at lag 0
    c = [float(np.dot(x[1000:-1000], y[1000 + d:len(y) - 1000 + d])) for d in range(-40, 41)]
    assert abs(int(np.argmax(c)) - 40) <= 2
    assert np.corrcoef(x, y)[0, 1] > 0.7


def test_noise_is_mixed_at_the_asked_snr_against_the_speech_power():
    pytest.importorskip("pedalboard")
    x = speechlike()
    power = float(np.mean(x.astype(np.float64) ** 2))
    for kind in ("white", "pink"):
        step = {"op": "noise", "kind": kind, "snr_db": 12.5, "seed": 3}
        y = channel.apply(x, [{"op": "family", "name": "noisy"}, step], power)
        snr = 10 * np.log10(power / np.mean((y.astype(np.float64) - x) ** 2))
        assert abs(snr - 12.5) < 0.1, (kind, snr)


def test_a_room_adds_a_reverberant_tail():
    pytest.importorskip("pyroomacoustics")
    x = np.zeros(RATE, np.float32)
    x[1000:1400] = speechlike(0.025)  # a short burst, then silence
    step = {"op": "room", "dims": [6.0, 5.0, 3.0], "rt60_s": 0.6, "seed": 1, "distance_m": 2.0}
    y = channel.apply(x, [{"op": "family", "name": "room"}, step], 0.01)
    assert len(y) == len(x)
    tail = np.sum(y[3000:8000].astype(np.float64) ** 2) / np.sum(y.astype(np.float64) ** 2)
    assert tail > 0.02  # energy 100-440 ms after the burst ended: the room's reverberation
    assert np.all(x[3000:8000] == 0)
    again = channel.apply(x, [{"op": "family", "name": "room"}, step], 0.01)
    assert np.array_equal(again, y)  # seeded


@needs_synths
def test_copies_carry_the_clean_clips_rate_pitch_pauses_and_their_own_heard_volume():
    pytest.importorskip("parselmouth")
    pytest.importorskip("pyroomacoustics")
    from specdec_cli.demo.corpus_v5 import hear, make_clean
    from specdec_cli.demo.measure import band, emotion_of, labels_of, measure, measure_level

    clips = make_clean("train", [0, 1], seed=5)
    for c in clips:
        # the oracle for the clean labels: measure the clean clip again from scratch
        labels, ambiguous = labels_of(measure(c.audio, RATE), c.gender)
        assert ambiguous == []
        assert {a: labels[a] for a in ("gender", "rate", "pitch", "pauses")} == c.labels
        for family in ("telephone", "codec", "far_field"):
            cp = hear(c, channel.draw(random.Random(f"t/{c.index}/{family}"), family), None)
            heard = measure_level(cp.audio, RATE)  # the heard clip, measured again
            assert cp.labels["volume"] == band("volume", heard)
            for a in ("gender", "rate", "pitch", "pauses"):
                assert cp.labels[a] == c.labels[a]
            assert cp.labels["emotion"] == emotion_of(c.labels["rate"], c.labels["pitch"])


@needs_synths
def test_held_out_clips_keep_an_ambiguous_attribute_out_of_their_labels(tmp_path):
    """Build a few held-out shards and check that every clip's labels are its measures' bands
    (ambiguous ones listed, not dropped), across every evaluation family."""
    pytest.importorskip("parselmouth")
    pytest.importorskip("pyroomacoustics")
    from specdec_cli.demo.corpus_v5 import HELDOUT_COPIES, ShardJob, make_shard
    from specdec_cli.demo.measure import band, cut_points, semitones

    make_shard(ShardJob(str(tmp_path / "val-000"), "val", 5, 0, 12))
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert names == sorted(("val" if f == "clean" else f"val_{f}") + "-000.json" for f in HELDOUT_COPIES)
    clean = json.loads((tmp_path / "val-000.json").read_text(encoding="utf-8"))
    assert len(clean) == 12
    refs = cut_points()["references_hz"]
    for m in clean:
        ms = m["measures"]
        expect = {"rate": band("rate", ms["rate"]), "pauses": band("pauses", ms["pause_share"]),
                  "pitch": band("pitch", semitones(ms["f0_hz"], m["labels"]["gender"])),
                  "volume": band("volume", m["heard_level_dbfs"])}
        assert refs  # (semitones reads them)
        for a, want in expect.items():
            if want is None:
                assert a in m["ambiguous"] and a not in m["labels"]
            else:
                assert m["labels"][a] == want and a not in m["ambiguous"]
    assert any(m["ambiguous"] for m in clean)  # seed 5 has some: they are kept, not drawn again
    tel = json.loads((tmp_path / "val_telephone-000.json").read_text(encoding="utf-8"))
    assert [m["index"] for m in tel] == [m["index"] for m in clean]
    assert all(m["band_limited"] and m["family"] == "telephone" for m in tel)
    assert not any(m["band_limited"] for m in clean)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
