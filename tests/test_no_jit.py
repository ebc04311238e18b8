"""No JIT on `--segment`'s path (issue 52, point 4): its first run paid numba compiling librosa's
helpers (44.0 s cold against 16.3 s warm for a 45 s file). The evidence is the process itself: a
whole `specdec describe --segment` in a fresh interpreter, with an empty numba cache, never imports
numba (nor librosa, which brings it). bench/segment_cold.py measures the times."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import SR, subprocess_env, tone

pytest_plugins = ["cli_fixtures"]

PROBE = """
import sys
from specdec_cli.commands.app import main
sys.argv = ["specdec", "--threads", "1", "describe", *sys.argv[1:], "--segment", "--quiet", "--max-new-tokens", "4"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(sorted(m for m in ("numba", "librosa") if m in sys.modules))
"""


@pytest.mark.spawns
def test_segment_runs_without_numba(tmp_path, tiny_pair):
    recording = tmp_path / "long.wav"
    sf.write(str(recording), np.concatenate([tone(20.0), np.zeros(SR, np.float32), tone(20.0, seed=3)]), SR)
    env = dict(subprocess_env(), NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    done = subprocess.run([sys.executable, "-c", PROBE, str(recording), "--edge", tiny_pair[0], "--cloud", tiny_pair[1]],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
    assert done.stdout.count(" s: ") >= 2  # it described the segments
