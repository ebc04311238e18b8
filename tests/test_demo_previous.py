"""The earlier demo pairs stay reachable: `python -m specdec_cli.demo.previous PAIR DIR` rebuilds each
from its committed training state, bit for bit the weights that were bundled (their sha256 recorded
when they were), with the presets they shipped with."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from specdec_cli.demo import previous

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("pair", ["v2", "v3", "v4", "v5"])
def test_an_earlier_pair_is_rebuilt_bit_for_bit_as_a_real_process(pair, tmp_path):
    done = subprocess.run([sys.executable, "-m", "specdec_cli.demo.previous", pair, str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    for model, (_, digest) in previous.PAIRS[pair].items():
        folder = tmp_path / model
        assert previous.sha256(folder / "model.safetensors") == digest
        presets = tomllib.loads((folder / "specdec_presets.toml").read_text(encoding="utf-8"))
        assert {"quality", "fluent"} <= set(presets), pair
    # the pair loads and describes like any other (the CLI's own loader)
    from specdec_cli.models import load_pair

    pair_ = load_pair(str(tmp_path / "edge"), str(tmp_path / "cloud"))
    assert pair_.edge.config.audio_token_index == pair_.cloud.config.audio_token_index


def test_a_state_that_no_longer_gives_the_bundled_weights_is_refused(tmp_path, monkeypatch):
    run, digest = previous.PAIRS["v3"]["edge"]
    monkeypatch.setitem(previous.PAIRS, "v3", {"edge": (run, "0" * 64)})
    with pytest.raises(SystemExit, match="not the v3 pair's"):
        previous.rebuild("v3", tmp_path)


def test_the_bundled_pair_is_the_latest_one():
    """`specdec_cli/demo/models/` holds v5 (issue 51): its weights are the ones `previous v5` rebuilds
    (the sha256 recorded when it was trained), and its presets file, in both folders, is v5's."""
    latest = max(previous.PAIRS, key=lambda p: int(p[1:]))
    assert latest == "v5"
    models = ROOT / "specdec_cli" / "demo" / "models"
    shipped = (ROOT / "specdec_cli" / "demo" / "previous" / f"{latest}_presets.toml").read_bytes()
    for model, (_, digest) in previous.PAIRS[latest].items():
        assert previous.sha256(models / model / "model.safetensors") == digest, model
        assert (models / model / "specdec_presets.toml").read_bytes() == shipped, model
