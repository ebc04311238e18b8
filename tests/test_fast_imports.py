"""Start-up shortcuts, each checked against the library's own result: the shared scan of
transformers/models, the quiet-by-environment setup, skipping the cloud tokenizer when its files
match the edge's, downmixing without librosa, and what `specdec --help` imports."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from specdec_cli.models import load_processor, same_tokenizer, same_tokenizer_files

pytest_plugins = ["cli_fixtures"]


def _python(code: str) -> str:
    """Run `code` in a fresh interpreter (imports are process-wide state) and return its stdout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_shared_models_scan_equals_the_librarys_own():
    out = _python("""
import json, sys
from pathlib import Path
from specdec_cli.fast_imports import import_transformers
transformers = import_transformers()
from transformers.utils import import_utils
from transformers import AutoConfig, Qwen2_5OmniThinkerForConditionalGeneration  # the lazy tables work
models_init = str(Path(transformers.__file__).parent / "models" / "__init__.py")
ours = import_utils.define_import_structure(models_init)
theirs = import_utils.define_import_structure.__wrapped__(models_init)  # a fresh scan, uncached key
print(json.dumps({"shared": getattr(import_utils.define_import_structure, "_specdec_shared", False),
                  "equal": ours == theirs, "entries": sum(len(v) for v in theirs.values())}))
""")
    result = json.loads(out)
    assert result == {"shared": True, "equal": True, "entries": result["entries"]} and result["entries"] > 1000


def test_quiet_by_environment_matches_the_logging_api():
    out = _python("""
import os
from specdec_cli.fast_imports import quiet_transformers
quiet_transformers()  # before transformers is imported: environment only
import transformers
from transformers.utils import logging
print(logging.get_verbosity() == logging.ERROR, logging.is_progress_bar_enabled())
""")
    assert out.split() == ["True", "False"]


def test_help_imports_no_heavy_library():
    out = _python("""
import sys
from typer.testing import CliRunner
from specdec_cli.commands.app import app
result = CliRunner().invoke(app, ["--help"])
assert result.exit_code == 0
print(sorted(m for m in ("torch", "transformers", "numpy", "soundfile", "librosa") if m in sys.modules))
""")
    assert out.strip() == "[]"


def test_identical_tokenizer_files_mean_the_same_tokenizer(tiny_pair, tmp_path):
    edge, cloud = tiny_pair
    assert same_tokenizer_files(edge, cloud)
    # the library's own answer: both load, and compare equal
    assert same_tokenizer(load_processor(edge).tokenizer, load_processor(cloud).tokenizer)
    # one byte changed, a file missing, or a Hub id: not shortcut, the caller loads and compares
    other = tmp_path / "other"
    shutil.copytree(cloud, other)
    (other / "tokenizer_config.json").write_text(
        (other / "tokenizer_config.json").read_text(encoding="utf-8") + " ", encoding="utf-8")
    assert not same_tokenizer_files(edge, str(other))
    (other / "tokenizer_config.json").unlink()
    assert not same_tokenizer_files(edge, str(other))
    assert not same_tokenizer_files(edge, "Qwen/Qwen2.5-Omni-7B")


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_downmix_matches_librosa(tmp_path, channels):
    import librosa
    from cli_helpers import tone, write_clip

    from specdec_cli.audio import load_audio

    path = write_clip(tmp_path / "c.wav", channels=channels, subtype="FLOAT")
    ours = load_audio(path, 16000, 30.0)
    expected = librosa.to_mono(np.atleast_2d(tone(channels=channels).T))
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rate", [22050, 44100, 48000, 8000])
def test_resampling_equals_librosas_default(tmp_path, rate):
    """The resampler is librosa.resample's default (soxr_hq, fix=True), called without librosa:
    the same samples, the same length, for rates down and up."""
    import librosa
    from cli_helpers import tone, write_clip

    from specdec_cli.audio import load_audio

    path = write_clip(tmp_path / "c.wav", seconds=1.37, sr=rate, subtype="FLOAT")
    ours = load_audio(path, 16000, 30.0)
    expected = librosa.resample(tone(1.37, sr=rate), orig_sr=rate, target_sr=16000, res_type="soxr_hq")
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)


def test_a_44k_clip_compiles_nothing(tmp_path):
    """Issue 44: the first 44.1 kHz clip cost ~50 s, numba compiling librosa's helpers. Reading
    and resampling a clip imports neither librosa nor numba (a fresh interpreter)."""
    from cli_helpers import write_clip

    path = write_clip(tmp_path / "phone.wav", sr=44100)
    out = _python(f"""
import sys
from specdec_cli.audio import load_audio
audio = load_audio({str(path)!r}, 16000, 30.0)
print(len(audio), sorted(m for m in ("librosa", "numba", "llvmlite") if m in sys.modules))
""")
    assert out.strip().split(maxsplit=1) == ["16000", "[]"]
