"""The results-file rules through real `specdec` processes on the bundled demo pair and two bundled
clips: lines specdec did not write, --overwrite and its backup, results made with other settings,
and two writers on one file. (The stale lock of a SIGKILLed run: test_batch.py's kill test.)"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

from cli_helpers import run_specdec, specdec_exe, subprocess_env

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CLIPS = ("f_fast_high.wav", "m_mid_high.wav")
TOKENS = ["--max-new-tokens", "16"]  # the same in every run here, so only the flags under test differ


def two_clips(root: Path) -> Path:
    clips = root / "clips"
    clips.mkdir()
    for name in CLIPS:
        shutil.copy(SAMPLES / name, clips / name)
    return clips


def refusal(proc: subprocess.CompletedProcess, out: Path) -> str:
    """The one line a refused run prints (exit 2, naming the file)."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out} "), proc.stderr
    return lines[0]


def test_foreign_lines_refused_overwrite_keeps_a_backup_other_settings_refused(tmp_path):
    clips = two_clips(tmp_path)
    out = tmp_path / "r.jsonl"
    foreign = b'garbage\n{"file": 3}\n'
    out.write_bytes(foreign)
    cloud = ["batch", str(clips), "--out", str(out), "--mode", "cloud", *TOKENS]

    line = refusal(run_specdec(*cloud), out)
    assert line.startswith(f"error: {out} line 1 is not JSON ('garbage'); the file was left as it is.")
    assert line.endswith(f"add --overwrite to start over (the old file is then kept as {out}.bak)")
    assert out.read_bytes() == foreign

    proc = run_specdec(*cloud, "--overwrite", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"the old results are kept in {out}.bak" in proc.stderr
    assert (tmp_path / "r.jsonl.bak").read_bytes() == foreign
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(Path(r["file"]).name for r in records) == sorted(CLIPS)
    assert all(r["error"] is None and r["mode"] == "cloud" and r["settings"]["mode"] == "cloud" for r in records)

    cloud_results = out.read_bytes()
    line = refusal(run_specdec("batch", str(clips), "--out", str(out), "--preset", "quality", *TOKENS), out)
    assert line.startswith(f"error: {out} line 1 was made with other settings (made with mode cloud, no preset, "), line
    assert "; this run has mode spec, preset quality, threshold " in line, line
    assert line.endswith(f"(the old file is then kept as {out}.bak-2)")  # .bak is taken
    assert out.read_bytes() == cloud_results


def test_a_second_writer_is_refused_while_the_first_runs(tmp_path):
    clips = two_clips(tmp_path)
    out = tmp_path / "r.jsonl"
    cmd = [specdec_exe(), "batch", str(clips), "--out", str(out), *TOKENS]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        # The file appears once the first run holds the lock; it then loads models for seconds, so it
        # is still running. Paused, it keeps the lock however slow the machine is.
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None and out.exists(), "the first run ended before it took the file"
        before = out.read_bytes()
        line = refusal(run_specdec(*cmd[1:]), out)
        assert line == (f"error: {out} is being written by another specdec batch (pid {first.pid}); "
                        "wait for it to finish, or give this run another --out")
        assert out.read_bytes() == before
    finally:
        first.send_signal(signal.SIGCONT)
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(Path(r["file"]).name for r in records) == sorted(CLIPS)  # the first run, undisturbed
