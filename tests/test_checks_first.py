"""Every check that needs no model runs before the models load (issue 52, point 3), for one clip and
many, in describe and batch: a clip over the window without --segment, a silent clip, a clip
without speech, a recording without speech under --segment, a dead cloud under
--on-cloud-failure fail. The evidence is a count, not a time: a spy on the pair loader
(specdec_cli.pair.load_pair) counts the loads; a good clip beside them is the control (one load)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import FAST, SR, tone
from typer.testing import CliRunner

import specdec_cli.pair as pair_module
from specdec_cli.commands.app import app

pytest_plugins = ["cli_fixtures"]


@pytest.fixture
def loads(monkeypatch) -> list[tuple]:
    """Each call of the pair loader, recorded; the real loader still runs."""
    calls: list[tuple] = []
    real = pair_module.load_pair

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(pair_module, "load_pair", spy)
    return calls


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("checks_first")
    sf.write(str(root / "long.wav"), tone(31.0), SR)                       # over the 30 s window
    sf.write(str(root / "silent.wav"), np.zeros(2 * SR, np.float32), SR)   # digital silence
    t = np.arange(3 * SR) / SR
    dial = (0.15 * (np.sin(2 * np.pi * 350 * t) + np.sin(2 * np.pi * 440 * t))).astype(np.float32)
    sf.write(str(root / "dial.wav"), dial, SR)                             # no speech
    sf.write(str(root / "dial_long.wav"), np.tile(dial, 15), SR)           # 45 s, no speech (--segment)
    good = root / "good"
    good.mkdir()
    sf.write(str(good / "voice.wav"), tone(1.5), SR)
    return root


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("name, said", [("long.wav", "over 30 s|30.0 s|is 31.0 s long"),
                                        ("silent.wav", "is silent"), ("dial.wav", "holds no speech")])
def test_one_clip_is_refused_before_any_model_loads(clips, models, loads, name, said):
    result = invoke("describe", str(clips / name), *models, *FAST)
    assert result.exit_code == 2, result.output
    assert any(part in result.output for part in said.split("|")), result.output
    assert loads == []


def test_many_clips_are_all_refused_before_any_model_loads(clips, models, loads):
    names = ["long.wav", "silent.wav", "dial.wav"]
    result = invoke("describe", *(str(clips / n) for n in names), *models, *FAST)
    assert result.exit_code == 2, result.output
    for name in names:
        assert f"{name}" in result.output
    assert "none of the 3 clips can be described" in result.output
    assert loads == []
    # The control: one good clip among them loads the pair once and describes it alone.
    result = invoke("describe", *(str(clips / n) for n in names), str(clips / "good" / "voice.wav"), *models, *FAST)
    assert result.exit_code == 1 and len(loads) == 1, result.output
    assert result.output.count("(skipped)") == 3


def test_segment_refuses_a_recording_without_speech_before_any_model_loads(clips, models, loads):
    result = invoke("describe", str(clips / "dial_long.wav"), "--segment", *models, *FAST)
    assert result.exit_code == 2 and "holds no speech" in result.output, result.output
    assert loads == []


def test_a_batch_of_refusals_records_them_and_loads_nothing(clips, models, loads, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("long.wav", "silent.wav", "dial.wav"):
        (folder / name).write_bytes((clips / name).read_bytes())
    out = tmp_path / "out.jsonl"
    result = invoke("batch", str(folder), "--out", str(out), *models, *FAST)
    assert result.exit_code == 1, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = {r["file"].rsplit("/", 1)[-1]: r["error_kind"] for r in records}
    assert kinds == {"long.wav": "too_long", "silent.wav": "input", "dial.wav": "input"}
    assert loads == []
    # The records are the loaded pair's: resuming with a good clip added takes them as this run's.
    (folder / "voice.wav").write_bytes((clips / "good" / "voice.wav").read_bytes())
    result = invoke("batch", str(folder), "--out", str(out), *models, *FAST)
    assert result.exit_code == 1 and len(loads) == 1, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["file"].rsplit("/", 1)[-1] for r in records} == {"long.wav", "silent.wav", "dial.wav", "voice.wav"}
    assert len({(r["edge"], r["cloud"]) for r in records}) == 1


def test_a_dead_cloud_under_fail_is_refused_before_any_model_loads(clips, tiny_pair, loads, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    clip = str(clips / "good" / "voice.wav")
    for args in (["describe", clip], ["batch", str(clips / "good"), "--out", str(tmp_path / "o.jsonl")]):
        result = invoke(*args, "--edge", tiny_pair[0], "--cloud", dead, "--on-cloud-failure", "fail", *FAST)
        assert result.exit_code == 2 and "cannot reach the cloud" in result.output, result.output
    assert loads == []
