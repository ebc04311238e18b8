"""Long recordings (issue 29, item 4): `--segment` cuts a recording longer than the model's window
at pauses into segments of at most the window, each its own record (`file` the recording,
`segment`, `segments`, `start_s`, `end_s`); a batch resumes per segment; without the flag the
refusal names it.

The oracles: a recording made here by joining the bundled samples with silences of known place, so
every boundary between two segments must fall in one of those silences; each segment's record
equals describing the file cut by hand at the segment's start and end (a separate file, a separate
`specdec describe`); a batch killed mid-recording and resumed holds every segment once, its first
records untouched."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from audio_files import flac_with_total
from cli_helpers import FAST, SR, run_specdec, tone, write_clip
from test_batch import lines, signal_after

from specdec_cli.audio import MIN_SECONDS, mono_blocks, recording_info
from specdec_cli.errors import InputError
from specdec_cli.segments import open_recording, plan

ROOT = Path(__file__).resolve().parents[1]
# The 16 kHz samples (f_telephone.wav is an 8 kHz telephone recording: joined here as it is, it
# would be read at twice its speed)
SAMPLES = sorted(p for p in (ROOT / "samples").glob("*.wav") if sf.info(str(p)).samplerate == 16000)
WINDOW_S = 30.0  # the demo pair's window (its Whisper feature extractor's 30 s)
GAP_S = 2.0
VOLATILE = ("latency_s", "tokens_per_s")
WHERE = ("file", "segment", "segments", "start_s", "end_s")


def specdec(*args: str, **kw) -> subprocess.CompletedProcess:
    return run_specdec("--threads", "1", *args, **kw)


def join_with_silences(path: Path, clips: list[Path], gap_s: float = GAP_S) -> list[tuple[int, int]]:
    """The clips one after another with `gap_s` of digital silence between them, written as 32-bit
    float WAV (so a cut read back is the same samples); the silences' frames [start, end)."""
    parts, silences, at = [], [], 0
    for i, clip in enumerate(clips):
        samples, rate = sf.read(str(clip), dtype="float32")
        assert rate == SR
        if i:
            gap = np.zeros(int(gap_s * SR), dtype=np.float32)
            parts.append(gap)
            silences.append((at, at + len(gap)))
            at += len(gap)
        parts.append(samples)
        at += len(samples)
    sf.write(str(path), np.concatenate(parts), SR, subtype="FLOAT")
    return silences


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> tuple[Path, list[tuple[int, int]]]:
    folder = tmp_path_factory.mktemp("recording")
    path = folder / "long.wav"
    silences = join_with_silences(path, SAMPLES)  # the nine 16 kHz samples: about 76 s
    return path, silences


def in_a_silence(frame: int, silences: list[tuple[int, int]]) -> bool:
    return any(a <= frame <= b for a, b in silences)


# -- where it cuts (in this process: the planner alone) ---------------------------------------------

def test_boundaries_fall_in_the_silences_and_segments_fit_the_window(recording):
    path, silences = recording
    planned = open_recording(path, SR, WINDOW_S)
    segments = planned.segments
    total = sf.info(str(path)).frames
    assert len(segments) >= 3 and segments[0].start == 0 and segments[-1].end == total
    for before, after in zip(segments, segments[1:], strict=False):
        assert before.end == after.start  # nothing between them is silent enough to leave out
        assert in_a_silence(before.end, silences), (before, silences)
    for s in segments:
        assert MIN_SECONDS * SR <= s.end - s.start <= WINDOW_S * SR
        assert (s.count, s.rate) == (len(segments), SR)
    # Cuts on the 10 ms grid: the seconds read as they are written (22.5, not 22.5000625).
    assert all(s.start % (SR // 100) == 0 for s in segments)


def test_the_cut_is_the_same_however_the_recording_is_read_in_blocks(recording):
    path, _ = recording
    info = recording_info(path)
    whole = plan(mono_blocks(path, None, info), SR, WINDOW_S)
    for block in (1000, 4097, 16000 * 31):
        assert plan(mono_blocks(path, None, info, block_frames=block), SR, WINDOW_S) == whole, block


def test_each_segment_is_the_files_frames_between_its_start_and_end(recording):
    path, _ = recording
    samples, _ = sf.read(str(path), dtype="float32")
    pieces = list(open_recording(path, SR, WINDOW_S).pieces())
    for piece in pieces:
        a, b = round(piece.segment.start_s * SR), round(piece.segment.end_s * SR)
        np.testing.assert_array_equal(piece.samples, samples[a:b])
    # Skipping some reads the others alike (a resumed batch's case).
    again = list(open_recording(path, SR, WINDOW_S).pieces(skip={0}))
    assert [p.segment for p in again] == [p.segment for p in pieces[1:]]
    np.testing.assert_array_equal(again[-1].samples, pieces[-1].samples)


def test_unbroken_sound_is_cut_at_the_window_and_silence_is_left_out(tmp_path):
    """No pause at all: cut no later than the window. A stretch of silence longer than the window is
    left out (nothing to describe); a recording of silence alone is refused as a silent clip is."""
    hum = tone(70.0)
    quiet = np.concatenate([tone(10.0), np.zeros(SR * 65, dtype=np.float32), tone(10.0, seed=1)])
    sf.write(str(tmp_path / "hum.wav"), hum, SR)
    sf.write(str(tmp_path / "gap.wav"), quiet, SR)
    cuts = open_recording(tmp_path / "hum.wav", SR, WINDOW_S).segments
    assert [s.end - s.start <= WINDOW_S * SR for s in cuts] == [True] * len(cuts) and cuts[-1].end == len(hum)
    kept = open_recording(tmp_path / "gap.wav", SR, WINDOW_S).segments
    assert all(np.abs(quiet[s.start:s.end]).max() > 0 for s in kept)
    assert kept[0].start == 0 and kept[-1].end == len(quiet)
    assert sum(s.end - s.start for s in kept) < len(quiet) - SR * 30  # at least one window of silence left out
    write_clip(tmp_path / "hush.wav", seconds=40, amplitude=0.0)
    with pytest.raises(InputError, match=r"hush.wav is silent \(peak below -60 dBFS\)"):
        open_recording(tmp_path / "hush.wav", SR, WINDOW_S)
    sf.write(str(tmp_path / "none.wav"), np.zeros(0, dtype=np.float32), SR)
    with pytest.raises(InputError, match=r"none.wav holds no audio samples; give a clip of at least 0.1 s"):
        open_recording(tmp_path / "none.wav", SR, WINDOW_S)
    write_clip(tmp_path / "short.wav", seconds=0.05)
    with pytest.raises(InputError, match=r"short.wav is 0.050 s long; give a clip of at least 0.1 s"):
        open_recording(tmp_path / "short.wav", SR, WINDOW_S)


def test_a_recording_is_read_under_its_own_cap(tmp_path, monkeypatch):
    """--segment's bound is separate from a clip's: a header over it is refused before decoding; a
    FLAC that does not say its length is refused once one frame past the cap is decoded, read in
    blocks of at most BLOCK_FRAMES (the oracle: soundfile's own reads, counted)."""
    from specdec_cli.audio import BLOCK_FRAMES

    reads: list[int] = []
    real = sf.SoundFile.read
    monkeypatch.setattr(sf.SoundFile, "read", lambda self, *a, **k: reads.append(len(out := real(self, *a, **k)))
                        or out)
    honest = write_clip(tmp_path / "honest.flac", seconds=120, sr=1000)
    with pytest.raises(InputError) as info:
        open_recording(honest, SR, WINDOW_S, cap_seconds=60.0)
    assert info.value.message == (f"{honest} is 120.0 s long; --segment reads at most 60.0 s per file: cut it "
                                  "into shorter files")
    assert reads == []
    streamed = tmp_path / "streamed.flac"
    sf.write(str(streamed), tone(70.0), SR, format="FLAC", subtype="PCM_16")
    streamed.write_bytes(flac_with_total(streamed.read_bytes(), 0))
    with pytest.raises(InputError) as info:
        open_recording(streamed, SR, WINDOW_S, cap_seconds=60.0)
    assert info.value.message == (f"{streamed} is over 60.0 s long; --segment reads at most 60.0 s per file: cut "
                                  "it into shorter files")
    assert sum(reads) == 60 * SR + 1 and max(reads) <= BLOCK_FRAMES
    cuts = open_recording(streamed, SR, WINDOW_S).segments  # under the default cap (4 h): read whole
    assert len(cuts) >= 3 and cuts[-1].end == 70 * SR


# -- through a real `specdec` --------------------------------------------------------------------------

@pytest.mark.spawns
def test_without_the_flag_the_refusal_names_it(recording, tmp_path):
    path, _ = recording
    done = specdec("describe", str(path), *FAST)
    assert done.returncode == 2
    seconds = sf.info(str(path)).frames / SR
    assert done.stderr == (f"error: {path} is {seconds:.1f} s long; the model takes at most 30 s per clip: add "
                           "--segment to cut it at pauses into segments of at most 30 s\n")
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "long.wav").symlink_to(path)
    batch = specdec("batch", str(folder), "--out", str(tmp_path / "r.jsonl"), *FAST)
    assert batch.returncode == 1
    [record] = lines(tmp_path / "r.jsonl")
    assert "add --segment to cut it at pauses" in record["error"] and record["description"] is None


@pytest.mark.spawns
def test_each_segment_is_described_as_its_cut_alone(recording, tmp_path):
    path, silences = recording
    done = specdec("describe", str(path), "--segment", "--json", *FAST)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    n = len(records)
    assert n >= 3
    assert [(r["file"], r["segment"], r["segments"]) for r in records] == [(str(path), i, n) for i in range(n)]
    assert all(r["error"] is None and r["description"] and r["settings"]["segment"] is True for r in records)
    table = (ROOT / "docs" / "records.md").read_text(encoding="utf-8")  # the record contract names them
    assert all(f"| `{name}`" in table for name in ("segment", "segments", "start_s`, `end_s", "settings.segment"))
    for before, after in zip(records, records[1:], strict=False):
        assert before["end_s"] == after["start_s"]
        assert in_a_silence(round(before["end_s"] * SR), silences)

    # The oracle: cut by hand at each record's start and end, described by a separate run.
    samples, _ = sf.read(str(path), dtype="float32")
    cuts = []
    for r in records:
        cut = tmp_path / f"cut_{r['segment']}.wav"
        sf.write(str(cut), samples[round(r["start_s"] * SR):round(r["end_s"] * SR)], SR, subtype="FLOAT")
        cuts.append(str(cut))
    alone = specdec("describe", *cuts, "--json", *FAST)
    assert alone.returncode == 0, alone.stderr
    for segment, single in zip(records, (json.loads(line) for line in alone.stdout.splitlines()), strict=True):
        assert segment["description"] == single["description"]
        mine = {k: v for k, v in segment.items() if k not in VOLATILE + WHERE}
        theirs = {k: v for k, v in single.items() if k not in VOLATILE + WHERE}
        assert mine.pop("settings") == dict(theirs.pop("settings"), segment=True)
        assert mine == theirs

    # Plain output: each sentence after the file and the segment's place.
    plain = specdec("describe", str(path), "--segment", *FAST)
    assert plain.stdout.splitlines() == [f"{path} {r['start_s']:.2f}–{r['end_s']:.2f} s: {r['description']}"
                                         for r in records]


@pytest.mark.spawns
def test_a_batch_killed_mid_recording_resumes_at_the_next_segment(recording, tmp_path):
    """SIGKILLed after its first segment's record: the rerun skips that one, describes the rest, and
    the file ends with every segment once, equal (latency aside) to `describe --segment`'s."""
    path, _ = recording
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "long.wav").symlink_to(path)
    write_clip(folder / "short.wav", seconds=0.6)
    out = tmp_path / "r.jsonl"
    args = ["--threads", "1", "batch", str(folder), "--out", str(out), "--segment", *FAST, "--batch-size", "1"]

    killed = signal_after(args, out, 1, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    first = lines(out)
    assert len(first) == 1 and first[0]["segment"] == 0

    resumed = run_specdec(*args, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 skipped" in resumed.stderr and "2/2 recordings" in resumed.stderr
    final = lines(out)
    assert final[0] == first[0]  # kept as it was
    keys = [(Path(r["file"]).name, r["segment"]) for r in final]
    assert len(keys) == len(set(keys))  # no segment twice
    n = final[0]["segments"]
    assert sorted(keys) == sorted([("long.wav", i) for i in range(n)] + [("short.wav", 0)])

    again = run_specdec(*args, timeout=300)  # everything recorded: nothing read, nothing loaded
    assert again.returncode == 0 and f"{n + 1} skipped" in again.stderr and lines(out) == final

    described = specdec("describe", str(folder / "long.wav"), "--segment", "--json", *FAST)
    by_segment = {json.loads(line)["segment"]: json.loads(line) for line in described.stdout.splitlines()}
    for r in final:
        if Path(r["file"]).name == "long.wav":
            assert {k: v for k, v in r.items() if k not in VOLATILE} == \
                {k: v for k, v in by_segment[r["segment"]].items() if k not in VOLATILE}


def test_segment_does_not_go_with_ray_yet(recording, tmp_path):
    """Refused in one line before anything is opened or loaded (the Ray path writes one record per file)."""
    from typer.testing import CliRunner

    from specdec_cli.commands.app import app

    result = CliRunner().invoke(app, ["batch", str(recording[0].parent), "--out", str(tmp_path / "r.jsonl"),
                                      "--segment", "--ray", "auto"])
    assert result.exit_code == 2
    assert result.stderr == "error: --segment does not go with --ray yet; run the segmented batch without --ray\n"
    assert not (tmp_path / "r.jsonl").exists()
