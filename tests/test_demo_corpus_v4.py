"""Demo pair v4's voices and corpus (demo contract v3): many voices from several synthesizers, whole
voices and a whole synthesizer held out, and every label what the audio measures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from specdec_cli.demo.voices import ESPEAK_VARIANTS, GENDER_F0_HZ, catalogue, family

SYNTHS = ("espeak-ng", "festival", "flite", "sox")
needs_synths = pytest.mark.skipif(any(shutil.which(t) is None for t in SYNTHS),
                                  reason="needs espeak-ng, festival, flite and sox (make speech)")


def test_at_least_forty_voices_from_three_synthesizers_with_voices_and_a_synthesizer_held_out():
    voices = catalogue()
    assert len(voices) >= 40
    assert len({v.synth for v in voices}) >= 3
    held = [v for v in voices if v.split == "heldout_voice"]
    assert len(held) >= 10 and {v.gender for v in held} == {"男声", "女声"}
    # one whole synthesizer appears only in held-out sets
    by_synth: dict[str, set[str]] = {}
    for v in voices:
        by_synth.setdefault(v.synth, set()).add(v.split)
    assert [s for s, splits in by_synth.items() if splits == {"heldout_synth"}] == ["flite"]
    # a voice family (variants of one voice) is never split between training and held-out
    fams: dict[str, set[str]] = {}
    for v in voices:
        fams.setdefault(family(v), set()).add(v.split)
    assert all(len(s) == 1 for s in fams.values()), fams
    # the training voices are many and both genders
    train = [v for v in voices if v.split == "train"]
    assert len(train) >= 25 and {v.gender for v in train} == {"男声", "女声"}


def test_every_voice_speaks_in_its_declared_genders_f0_range():
    for v in catalogue():
        lo, hi = GENDER_F0_HZ[v.gender]
        assert lo <= v.f0_hz <= hi, v


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_every_espeak_variant_exists_and_is_not_the_base_voice():
    """espeak-ng renders an unknown variant name silently as the base voice."""
    text = "今天天气很好"
    base = subprocess.run(["espeak-ng", "-v", "cmn-latn-pinyin", "--stdout", text], capture_output=True, check=True).stdout
    for v in catalogue():
        if v.synth != "espeak-ng":
            continue
        assert (ESPEAK_VARIANTS / v.ident).is_file(), v.ident
        out = subprocess.run(["espeak-ng", "-v", f"cmn-latn-pinyin+{v.ident}", "--stdout", text],
                             capture_output=True, check=True).stdout
        assert out != base, v.ident


@needs_synths
@pytest.mark.parametrize("split", ["train", "val_voices", "val_synth"])
def test_clips_are_labelled_by_what_their_audio_measures(split):
    pytest.importorskip("parselmouth")
    from specdec_cli.demo.corpus_v4 import AIMED, SPLITS, make_clips
    from specdec_cli.demo.measure import labels_of, measure

    by_name = {v.name: v for v in catalogue()}
    clips = make_clips(split, [0, 1, 2], seed=4, noise_p=0.0, snr=(0.0, 0.0))
    for c in clips:
        voice = by_name[c.plan.voice]
        assert voice.split == SPLITS[split]
        # the oracle: measure the finished clip again, from scratch
        labels, ambiguous = labels_of(measure(c.audio, 16_000), voice.gender)
        assert ambiguous == [] and labels == c.labels
        assert all(c.labels[a] == c.plan.targets[a] for a in AIMED)
    # a pure function of (seed, split, index)
    again = make_clips(split, [1], seed=4, noise_p=0.0, snr=(0.0, 0.0))[0]
    assert np.array_equal(again.audio, clips[1].audio) and again.labels == clips[1].labels


@needs_synths
def test_heldout_clips_written_to_disk_measure_as_labelled(tmp_path):
    """What `specdec eval`/`calibrate` read: the WAV files as written (16-bit) measure as their
    labels say, through the measuring command itself."""
    pytest.importorskip("parselmouth")
    from specdec_cli.demo.heldout import write_heldout

    labels_file = write_heldout(tmp_path / "clips", clips=3, start=0)
    written = [json.loads(x) for x in labels_file.read_text(encoding="utf-8").splitlines()]
    assert [w["split"] for w in written] == ["val", "val_voices", "val_synth"]
    genders = tmp_path / "genders.jsonl"
    genders.write_text("".join(json.dumps({"file": w["file"], "gender": w["labels"]["gender"]}, ensure_ascii=False) + "\n"
                               for w in written), encoding="utf-8")
    out = tmp_path / "measured.jsonl"
    done = subprocess.run([sys.executable, "-m", "specdec_cli.demo.measure", str(tmp_path / "clips"),
                           "--genders", str(genders), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    measured = {x["file"]: x["labels"] for x in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    for w in written:
        assert measured[w["file"]] == w["labels"], w["file"]
