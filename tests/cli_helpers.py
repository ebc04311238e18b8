"""Plain helpers for the CLI tests: generated clips, a corpus of bad files, a runner for the
installed `specdec` command. (The fixtures are in cli_fixtures.py.)"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

_REPO = Path(__file__).resolve().parents[1]

SR = 16000
# Small enough to keep every run of the tiny pair well under a second.
FAST = ["--max-new-tokens", "12"]


# Bundled samples with speech from end to end (few pauses): what `tone` cuts its clips from.
_SPEECH = ("f_fast_low.wav", "f_mid_mid_loud.wav", "m_mid_high.wav")


@functools.cache
def _speech(sr: int) -> np.ndarray:
    import wave

    import soxr

    parts = []
    for name in _SPEECH:
        # The standard library's reader: a test spying on soundfile's reads does not count these.
        with wave.open(str(_REPO / "samples" / name)) as w:
            assert (w.getsampwidth(), w.getnchannels(), w.getframerate()) == (2, 1, SR)
            x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
        # Its loud 10 ms stretches only (within 25 dB of the loudest): any cut of it is speech.
        frames = x[: len(x) // 160 * 160].reshape(-1, 160)
        level = np.sqrt(np.mean(frames**2, axis=1))
        parts.append(frames[level > level.max() * 10 ** (-25 / 20)].ravel())
    x = np.concatenate(parts)
    return x if sr == SR else soxr.resample(x, SR, sr).astype(np.float32)


def tone(seconds: float = 1.0, sr: int = SR, channels: int = 1, amplitude: float = 0.3, seed: int = 0) -> np.ndarray:
    """A test clip: a stretch of speech (the bundled samples; since issue 52 a tone is refused as no
    speech), `seed` choosing where it starts, looped when longer than they are, its peak at
    `amplitude` (0: digital silence). [frames] or [frames, channels]."""
    source = _speech(sr)
    n = int(sr * seconds)
    start = int((0.4 + seed * 0.73) * sr) % len(source)  # 0.4 s: past the first sample's lead-in
    x = np.resize(np.roll(source, -start), n)
    peak = float(np.abs(x).max()) if n else 0.0
    x = (x * (amplitude / peak) if peak else x).astype(np.float32)
    return x if channels == 1 else np.stack([x * (0.5 + 0.5 * c / channels) for c in range(channels)], axis=1)


def write_clip(path: Path, seconds: float = 1.0, sr: int = SR, channels: int = 1, subtype: str | None = None,
               amplitude: float = 0.3, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), tone(seconds, sr, channels, amplitude, seed), sr, subtype=subtype)
    return path


def bad_corpus(root: Path) -> dict[str, tuple[Path, str]]:
    """One file per kind of bad input: kind -> (path, a phrase the error message must contain)."""
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, tuple[Path, str]] = {}
    empty = root / "empty.wav"
    empty.write_bytes(b"")
    files["empty"] = (empty, "empty (0 bytes)")
    text = root / "notes.wav"
    text.write_text("this is not audio, just text with a .wav name\n" * 20)
    files["not_audio"] = (text, "cannot decode")
    files["too_short"] = (write_clip(root / "short.wav", seconds=0.05), "at least 0.1 s")
    nan = tone(0.5)
    nan[100] = np.nan
    sf.write(str(root / "nan.wav"), nan, SR, subtype="FLOAT")
    files["nan"] = (root / "nan.wav", "NaN or infinite")
    inf = tone(0.5)
    inf[10] = np.inf
    sf.write(str(root / "inf.wav"), inf, SR, subtype="FLOAT")
    files["inf"] = (root / "inf.wav", "NaN or infinite")
    # 31 s at 1 kHz keeps the file small; the limit is on duration, whatever the rate.
    files["too_long"] = (write_clip(root / "long.wav", seconds=31, sr=1000), "at most 30 s")
    files["silent"] = (write_clip(root / "silent.wav", amplitude=0.0), "silent")
    sf.write(str(root / "no_samples.wav"), np.zeros(0, dtype=np.float32), SR)
    files["no_samples"] = (root / "no_samples.wav", "no audio samples")
    return files


def specdec_exe() -> str:
    """The installed console script of this venv (pip install --config-settings editable_mode=compat -e .)."""
    exe = Path(sys.executable).parent / "specdec"
    if not exe.exists():
        pytest.skip("the specdec console script is not installed (pip install --config-settings editable_mode=compat -e .)")
    return str(exe)


def subprocess_env() -> dict[str, str]:
    # One thread per child keeps the shared machine responsive; offline so no path ever hits the Hub.
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONIOENCODING="utf-8")
    env.pop("SPECDEC_DEBUG", None)
    return env


def run_specdec(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([specdec_exe(), *args], capture_output=True, text=True, encoding="utf-8",
                          env=subprocess_env(), timeout=timeout, cwd=cwd)


# -- what `specdec calibrate` measured, read back from the comments it writes in a presets file ---

def measured(presets_text: str) -> dict[str, tuple[float, float]]:
    """(quality, cloud calls per token) per '# <half> half: ...' comment, keyed 'preset/half'
    (half: calibration or check)."""
    out, section = {}, "header"
    for line in presets_text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        m = re.match(r"# (calibration|check) half:\s+quality ([\d.]+), cloud calls per token ([\d.]+)", line)
        if m:
            out[f"{section}/{m[1]}"] = (float(m[2]), float(m[3]))
    return out


def cloud_only_measured(presets_text: str) -> tuple[float, float]:
    """Cloud-only's quality on the (calibration, check) halves, from the file's header comment."""
    m = re.search(r"# cloud-only: quality ([\d.]+) calibration / ([\d.]+) check", presets_text)
    assert m, presets_text
    return float(m[1]), float(m[2])


def heldout_clips(tmp_path_factory: pytest.TempPathFactory, clips: int, start: int) -> list[Path]:
    """`clips` held-out demo clips (clauses never used in training) from index `start`, made with
    espeak-ng in a fresh folder; the test skips where espeak-ng is missing."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (`make test` installs it)")
    from specdec_cli.demo.heldout import write_heldout

    out = tmp_path_factory.mktemp("heldout")
    write_heldout(out, clips, start=start)
    return sorted(out.glob("*.wav"))


def report_matches_presets(report: dict, text: str) -> None:
    """`calibrate --report`'s JSON says what the presets file `text` of the same run says: the file
    parsed as TOML for the chosen settings, its comments (written to 1 and 3 decimals) for their
    scores: an independent reading of the same run."""
    data = tomllib.loads(text)
    settings = {s["name"]: s for s in report["settings"]}
    assert len(settings) == len(report["settings"])  # one entry per setting run
    assert f"({report['n_calib']} calibration: 1st, 3rd, ...; {report['n_check']} check" in text
    assert f"# quality measure: {report['measure']}" in text

    # the baselines: the header's "cloud-only: quality C calibration / K check, ... per token c / k"
    for name in ("cloud-only", "edge-only"):
        s = settings[name]
        assert s["mode"] != "spec" and s["chosen"] == []
        line = next(x for x in text.splitlines() if x.startswith(f"# {name}: quality"))
        assert line == (f"# {name}: quality {s['calibration']['quality']:.1f} calibration / "
                        f"{s['check']['quality']:.1f} check, cloud calls per token "
                        f"{s['calibration']['call_rate']:.3f} / {s['check']['call_rate']:.3f}")
    assert cloud_only_measured(text) == (round(settings["cloud-only"]["calibration"]["quality"], 1),
                                         round(settings["cloud-only"]["check"]["quality"], 1))

    # each written preset is the setting the report marks chosen, with the file's scores
    scores = measured(text)
    written = [n for n in ("quality", "fluent", "frugal") if n in data]
    assert [c["name"] for c in report["choices"]] == ["quality", "fluent"]
    for c in report["choices"]:
        assert f"within {c['points']:g} point(s)" in data[c["name"]]["description"]
        assert data[c["name"]]["description"].startswith("cheapest") is c["met"]
    g = report["gate"]  # None: --no-gate
    assert (g is not None and g["met"]) == ("frugal" in data) == ("gate" in data)
    chosen = {c["name"]: c["setting"] for c in report["choices"]} | ({} if g is None else {g["name"]: g["setting"]})
    for name in written:
        s, preset = settings[chosen[name]], data[name]
        assert name in s["chosen"]
        assert (s["mode"], s["k"], s["verify"]) == ("spec", preset["k"], preset["verify"])
        if preset["verify"] == "meaning":
            assert (s["gate_upload"], s["gate_verify"]) == (preset["gate_upload"], preset["gate_verify"])
        else:
            assert s["threshold"] == (None if math.isinf(preset["threshold"]) else preset["threshold"])
        for half in ("calibration", "check"):
            q, rate = scores[f"{name}/{half}"]
            assert (f"{s[half]['quality']:.1f}", f"{s[half]['call_rate']:.3f}") == (f"{q:.1f}", f"{rate:.3f}")
        # how sure it is within its budget: the report's gap bounds, as the file's comment says them
        # (a report written before issue 41's margin has none)
        if "gap" not in s:
            continue
        cal, chk = s["gap"]["calibration"], s["gap"]["check"]
        said = (f"# gap to cloud-only {cal['mean']:+.2f} points, lower bound {cal['lower']:+.2f} at z {cal['z']:.2f} "
                "(calibration half)")
        if chk is not None:  # None: --margin 0, the plain rule, checks nothing
            said += f"; {chk['mean']:+.2f}, {chk['lower']:+.2f} at z {chk['z']:.2f} (check half)"
        assert said in text.split(f"[{name}]")[1].split("\n[")[0].splitlines()
    # no setting claims a preset the file does not have
    assert sorted(n for s in settings.values() for n in s["chosen"]) == sorted(written)

    # the gate's own figures: its comments' zero-cloud share and work per clip, its swaps and weights
    if "frugal" not in data:
        return
    for half, comment in (("calibration", "calibration half"), ("check", "check half")):
        line = next(x for x in text.split("[frugal]")[1].splitlines() if x.startswith(f"# {comment}:"))
        assert f"zero-cloud {100 * g[half]['zero_cloud_share']:.1f}%" in line
        assert f"cloud work per clip {g[half]['work_per_clip']:.1f} tokens" in line
        assert f"{g[half]['quality']:.1f}" in line and f"{g[half]['call_rate']:.3f}" in line
    assert f"({g['swaps']} self-labelled swaps" in data["gate"]["description"]
    assert g["weights"] == len(data["gate"]["ids"])
    assert f"within {g['points']:g} point(s)" in data["frugal"]["description"]
    assert ("--margin" in data["frugal"]["description"]) is (g["margin"] != 1.0)


def bench_module(name: str):
    """A bench script as a module (bench/ on the path, as when it runs)."""
    sys.path.insert(0, str(_REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_bench", _REPO / f"bench/{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(_REPO / "bench"))
