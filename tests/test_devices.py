"""--edge-device / --cloud-device (issue 19): each model loads on its own device, the prompt reaches
each on its own, and the output is the one-device run's. Tests can run two CPU device strings only
("cpu" and "cpu:0": torch keeps both on the host), so the placement is checked where it is decided
(the device each model is loaded on, the device each ModelState's prompt lives on) and the output
against the one-device run's."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import FAST, write_clip
from typer.testing import CliRunner

from specdec_cli import models as models_module
from specdec_cli.commands.app import app
from specdec_cli.decoding.state import ModelState

pytest_plugins = ["cli_fixtures"]


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("devices") / "clip.wav", seconds=1.0, seed=5)


def describe(wav, models_args, *extra):
    result = CliRunner().invoke(app, ["describe", str(wav), "--json", "--no-live", *FAST, *models_args, *extra])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    return {k: v for k, v in record.items() if k not in ("latency_s", "tokens_per_s")}


@pytest.mark.parametrize("mode", [["--verify", "always"], ["--threshold", "0.5", "--k", "3"], ["--mode", "cloud"],
                                  ["--mode", "edge"], ["--verify", "always", "--sample", "--seed", "2"]])
def test_two_devices_give_the_one_device_output(wav, models, monkeypatch, mode):
    loaded = []
    real = models_module.load_model

    def spy(path, device="cpu", dtype="float32"):
        loaded.append((path, device))
        return real(path, device, dtype)

    monkeypatch.setattr(models_module, "load_model", spy)
    one = describe(wav, models, *mode)
    assert [d for _, d in loaded] == ["cpu", "cpu"]
    loaded.clear()
    two = describe(wav, models, "--edge-device", "cpu", "--cloud-device", "cpu:0", *mode)
    assert loaded == [(models_arg(models, "--edge"), "cpu"), (models_arg(models, "--cloud"), "cpu:0")]
    assert two == one and one["tokens"] > 0


def models_arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_device_alone_still_places_both(wav, models, monkeypatch):
    loaded = []
    real = models_module.load_model
    monkeypatch.setattr(models_module, "load_model", lambda p, d="cpu", t="float32": loaded.append(d) or real(p, d, t))
    describe(wav, models, "--device", "cpu:0", "--mode", "cloud")
    assert loaded == ["cpu:0", "cpu:0"]
    loaded.clear()
    describe(wav, models, "--device", "cpu:0", "--edge-device", "cpu", "--mode", "cloud")
    assert loaded == ["cpu", "cpu:0"]


class _Elsewhere(torch.nn.Module):
    """A model reporting another device than the inputs' (the meta device: nothing runs on it)."""

    device = torch.device("meta")


def test_each_state_moves_the_prompt_to_its_own_device(processor):
    from conftest import clip

    inputs = processor(clip(1))
    state = ModelState(_Elsewhere())
    state.start(inputs)
    assert all(v.device.type == "meta" for v in state.prompt.values())
    assert all(v.device.type == "cpu" for v in inputs.values())  # the caller's tensors are left alone
    assert state.prompt_ids == inputs["input_ids"][0].tolist()
