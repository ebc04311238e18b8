"""Issue 36 (and 33 item 5): every multi-clip command treats a folder of real-world files the same
way, through the real CLI (the bundled demo pair) on a folder built here: espeak-ng speech, a
truncated WAV, an empty file, text named .wav, a FIFO, a link to a device, a dangling link, a
symlink loop, a file name holding an escape sequence. Each bad entry is named with its reason
before any model loads, the others are described, and the run ends with exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from audio_files import write_m4a
from cli_helpers import FAST, heldout_clips, run_specdec, specdec_exe, subprocess_env

from specdec_cli.inputs import check_clips, clips_for_resolution, resolution_points

ESC_NAME = "bell\x1b[2Jname.wav"  # a file name that would clear the screen if printed raw


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """A folder of 3 speech clips, a truncated one and every kind of bad entry: (folder, name ->
    the reason its line must give, the whole clip the truncated one was cut from)."""
    good = heldout_clips(tmp_path_factory, 3, start=1100)
    root = tmp_path_factory.mktemp("mixed")
    for clip in good:
        (root / clip.name).write_bytes(clip.read_bytes())
    whole = good[0]
    data = whole.read_bytes()
    (root / "cut.wav").write_bytes(data[: len(data) * 6 // 10])  # a copy cut short: the header still says all
    write_m4a(root / "phone.m4a", sf.read(str(good[1]), dtype="float32")[0])  # what phones record
    (root / "empty.wav").write_bytes(b"")
    (root / "notes.wav").write_text("not audio, just text with a .wav name\n" * 20)
    (root / ESC_NAME).write_text("not audio either\n" * 20)
    os.mkfifo(root / "pipe.wav")
    (root / "zero.wav").symlink_to("/dev/zero")
    (root / "dangling.wav").symlink_to(root / "gone.wav")
    (root / "loop.wav").symlink_to(root / "loop.wav")
    reasons = {"empty.wav": "is empty (0 bytes)", "notes.wav": "cannot decode", ESC_NAME: "cannot decode",
               "pipe.wav": "FIFO", "zero.wav": "device", "dangling.wav": "dangling symlink",
               "loop.wav": "symlink loop"}
    return root, reasons, whole


def _speech(root: Path) -> list[str]:
    """The three held-out speech clips' names (held-out sets name clips by set and index)."""
    names = sorted(p.name for p in root.glob("*.wav") if p.name.split("-")[0] in ("val", "val_voices", "val_synth"))
    assert len(names) == 3, names
    return names


def _lines(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def _header_and_held_seconds(path: Path, whole: Path) -> tuple[float, float]:
    """What the WAV header of `path` (cut from `whole`) claims and what it holds, from the stdlib
    reader and byte counts (an oracle independent of soundfile and of specdec's audio module): the
    header's size is the whole file's less its samples."""
    with wave.open(str(path)) as w:
        claimed, rate, width = w.getnframes(), w.getframerate(), w.getsampwidth() * w.getnchannels()
    header = whole.stat().st_size - claimed * width
    return claimed / rate, (path.stat().st_size - header) // width / rate


def test_batch_names_every_entry_it_skips_with_the_reason(mixed, tmp_path):
    root, reasons, _ = mixed
    out = tmp_path / "r.jsonl"
    done = run_specdec("batch", str(root), "--out", str(out), *FAST, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "\x1b" not in done.stderr and "Traceback" not in done.stderr  # the escape is printed escaped
    skipped = {Path(line.split(": ")[1]).name: line for line in _lines(done.stderr, "skipped: ")}
    assert set(skipped) == {"pipe.wav", "zero.wav", "dangling.wav", "loop.wav"}
    for name, line in skipped.items():
        assert reasons[name] in line, line
    failed = _lines(done.stderr, "failed: ")
    assert len(failed) == 3 and any("bell\\x1b[2Jname.wav" in line for line in failed)
    records = {Path(r["file"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(n for n, r in records.items() if r["error"] is None) == sorted(["cut.wav", "phone.m4a",
                                                                                 *_speech(root)])
    assert "4 other entries skipped" in done.stderr.splitlines()[-1]


def test_eval_skips_each_bad_clip_before_loading_and_says_how_many_it_scored(mixed, tmp_path):
    root, reasons, whole = mixed
    report = tmp_path / "report.json"
    done = run_specdec("eval", str(root), "--modes", "edge", "--report", str(report), *FAST, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    skipped = _lines(done.stderr, "skipped: ")
    assert len(skipped) == len(reasons)  # all at once, one line each
    assert max(lines.index(s) for s in skipped) < min(i for i, line in enumerate(lines) if "cut short" in line)
    claimed, held = _header_and_held_seconds(root / "cut.wav", whole)
    assert abs(claimed - sf.info(str(whole)).duration) < 0.01  # the oracle agrees the header claims the whole
    [cut] = [line for line in lines if "cut short" in line]
    assert cut == (f"warning: {root / 'cut.wav'} is cut short: its header says {claimed:.2f} s, the file holds "
                   f"{held:.2f} s; described as it is")
    assert "eval: scored 5 clips; 7 skipped (named above)" in lines
    assert any(line.startswith("warning: only 5 clips:") for line in lines)
    assert lines[-1] == "error: 7 of 12 clips failed (each said why above)"
    data = json.loads(report.read_text())
    assert data["clips"] == 5 and len(data["skipped"]) == 7
    assert {Path(s["file"]).name for s in data["skipped"]} == set(reasons)


def test_describe_lists_every_bad_clip_first_and_describes_the_rest_in_order(mixed):
    root, _, _ = mixed
    first, second, _ = _speech(root)
    clips = [root / first, root / "nonexist.wav", root / "notes.wav", root / "empty.wav",
             root / second, root / "pipe.wav"]
    done = run_specdec("describe", *map(str, clips), "--json", *FAST, timeout=300)
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["file"] for r in records] == list(map(str, clips))  # input order, failures in their place
    assert [r["error"] is None for r in records] == [True, False, False, False, True, False]
    errors = _lines(done.stderr, "error: ")
    assert len(errors) == 5 and errors[-1] == "error: 4 of 6 clips failed (each said why above)"
    assert all(e.endswith("(skipped)") for e in errors[:4])


def test_calibrate_says_what_its_choice_rests_on(mixed, tmp_path):
    root, _, _ = mixed
    out = tmp_path / "p.toml"
    done = run_specdec("calibrate", str(root), "--out", str(out), "--no-gate", "--ks", "4", "--percentiles", "50",
                       *FAST, timeout=600)
    assert done.returncode == 1, done.stderr
    assert len(_lines(done.stderr, "skipped: ")) == 7 and out.exists()
    assert "calibrate: chose on 3 clips, checked on 2; 7 skipped (named above)" in done.stderr
    need = 2 * clips_for_resolution(1.0)
    assert f"warning: the choice rests on 3 calibration clips (checked on 2): one attribute changed on one clip " \
           f"moves quality by {resolution_points(3):.1f} points, more than the 1-point target; calibrate on at " \
           f"least {need} clips" in done.stderr


def test_resolution_is_one_attribute_on_one_clip():
    # 6 attributes: one wrong on one of n clips is 100 / (6 n) points.
    assert resolution_points(10) == pytest.approx(100 / 60)
    assert clips_for_resolution(1.0) == 17 and resolution_points(17) <= 1.0 < resolution_points(16)


def test_check_clips_keeps_the_order_and_names_each_problem(mixed):
    root, reasons, _ = mixed
    first = _speech(root)[0]
    names = [first, "empty.wav", "cut.wav", "pipe.wav", "zero.wav", "notes.wav"]
    checked = check_clips([root / n for n in names])
    assert [p.name for p in checked.clips] == [first, "cut.wav"]
    assert [s.path.name for s in checked.skipped] == ["empty.wav", "pipe.wav", "zero.wav", "notes.wav"]
    for s in checked.skipped:
        assert reasons[s.path.name].lower() in s.reason.lower(), s.reason


def test_presets_prints_a_description_escaped(tmp_path):
    presets = tmp_path / "p.toml"
    presets.write_text('[fluent]\nthreshold = 2.0\ndescription = "evil\\u001b[2J\\nfake line"\n', encoding="utf-8")
    done = run_specdec("presets", "--presets", str(presets))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "evil\\x1b[2J\\nfake line" in done.stdout.replace("\n", "")


def test_a_hub_id_without_the_network_fails_at_once_in_one_line(tmp_path):
    clip = tmp_path / "a.wav"
    sf.write(str(clip), (0.3 * np.sin(np.arange(16000) / 10)).astype(np.float32), 16000)
    env = dict(subprocess_env(), HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    done = subprocess.run([specdec_exe(), "describe", str(clip), "--cloud", "Qwen/Qwen2.5-Omni-7B"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "Hub id that is not in the local cache, and HF_HUB_OFFLINE is set" in done.stderr
    assert "local folder" in done.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder whatever its permissions")
def test_batch_names_an_unreadable_subfolder(tmp_path):
    from cli_helpers import write_clip

    write_clip(tmp_path / "a.wav")
    locked = tmp_path / "locked"
    write_clip(locked / "b.wav")
    locked.chmod(0)
    try:
        from specdec_cli.results import find_audio

        found = find_audio(tmp_path, recursive=True)
    finally:
        locked.chmod(0o755)
    assert [p.name for p in found.files] == ["a.wav"]
    assert found.skipped_lines() == [f"skipped: {locked}: cannot read this folder: Permission denied"]


def test_an_m4a_reads_as_its_source_under_the_same_bounds(tmp_path):
    """m4a/AAC through PyAV: the samples are the source's (same length within the codec's padding,
    same loudness), and a clip over the window is refused by its header before any decoding."""
    from cli_helpers import tone

    from specdec_cli.audio import load_audio
    from specdec_cli.errors import InputError

    source = tone(2.0, amplitude=0.3)
    clip = write_m4a(tmp_path / "a.m4a", source)
    got = load_audio(clip, 16000, 30.0)
    assert abs(len(got) - len(source)) <= 2048  # AAC's priming and last-frame padding, at most two frames
    rms = lambda x: float(np.sqrt(np.mean(np.square(x))))  # noqa: E731
    assert rms(got) == pytest.approx(rms(source), rel=0.05)
    long = write_m4a(tmp_path / "long.m4a", tone(31.0, amplitude=0.3))
    with pytest.raises(InputError, match=r"long\.m4a is 31\.\d s long; the model takes at most 30 s"):
        load_audio(long, 16000, 30.0)
    done = run_specdec("describe", str(clip), *FAST)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
