"""--temperature / --top-p / --top-k and --instruction / --system (issue 19), end to end through the
CLI on the tiny saved pair, each against an independent oracle: HF `generate` on the prompt built
by hand, the same command with the values given another way (a presets file), and the record's
settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import FAST, write_clip
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.decoding import DecodingConfig, generate_baseline
from specdec_cli.models import load_pair
from specdec_cli.prompt import INSTRUCTION, SYSTEM, render_prompt

pytest_plugins = ["cli_fixtures"]

# Characters the tests' character tokenizer knows (conftest.TEXTS and the default prompt).
EMOTION_ONLY = "请用一句中文描述说话人的情绪。"
OTHER_SYSTEM = "You are a careful assistant."


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("user_options") / "clip.wav", seconds=1.0, seed=3)


def describe(wav: Path, models: list[str], *extra: str) -> dict:
    result = CliRunner().invoke(app, ["describe", str(wav), "--json", "--no-live", *FAST, *models, *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_instruction_and_system_reach_the_models(wav, models, tiny_pair):
    """Cloud mode with a changed prompt gives what HF generate gives on that prompt, built here by
    hand; and not what the default prompt gives (the prompt did reach the model)."""
    import soundfile as sf

    pair = load_pair(*tiny_pair)
    audio, _ = sf.read(wav, dtype="float32")
    cfg = DecodingConfig(mode="cloud", max_new_tokens=12)
    outs = {}
    for instruction, system in ((INSTRUCTION, SYSTEM), (EMOTION_ONLY, SYSTEM), (EMOTION_ONLY, OTHER_SYSTEM)):
        inputs = pair.processor(audio, render_prompt(instruction, system))
        assert EMOTION_ONLY not in render_prompt() and instruction in pair.tokenizer.decode(inputs["input_ids"][0])
        tokens = generate_baseline(pair.cloud, inputs, cfg, pair.masks, pair.eos_ids).tokens
        outs[instruction, system] = pair.tokenizer.decode(tokens, skip_special_tokens=True).strip()
    assert len(set(outs.values())) > 1
    for (instruction, system), expected in outs.items():
        args = ["--mode", "cloud"]
        if instruction != INSTRUCTION:
            args += ["--instruction", instruction]
        if system != SYSTEM:
            args += ["--system", system]
        record = describe(wav, models, *args)
        assert record["description"] == expected, (instruction, system)
        assert record["settings"]["instruction"] == (None if instruction == INSTRUCTION else instruction)
        assert record["settings"]["system"] == (None if system == SYSTEM else system)


def test_the_rules_stay_on_under_another_instruction(wav, models):
    """The one-sentence rules do not depend on the prompt: with them on, the speculative answer
    under another instruction equals cloud-only's (verify always) and holds no mark too early;
    --constraints off gives plain decoding."""
    on = describe(wav, models, "--instruction", EMOTION_ONLY, "--verify", "always")
    cloud = describe(wav, models, "--instruction", EMOTION_ONLY, "--mode", "cloud")
    off = describe(wav, models, "--instruction", EMOTION_ONLY, "--mode", "cloud", "--constraints", "off")
    assert on["description"] == cloud["description"]
    assert off["settings"]["constraints"] is False and on["settings"]["constraints"] is True


def test_sampling_knobs_in_flags_and_in_a_presets_file_agree(wav, models, tmp_path):
    flags = describe(wav, models, "--sample", "--seed", "3", "--temperature", "0.7", "--top-p", "0.9",
                     "--top-k", "40", "--verify", "always")
    assert (flags["settings"]["temperature"], flags["settings"]["top_p"], flags["settings"]["top_k"]) == (0.7, 0.9, 40)
    presets = tmp_path / "presets.toml"
    presets.write_text('[warm]\nverify = "always"\nsample = true\nseed = 3\ntemperature = 0.7\ntop_p = 0.9\n'
                       'top_k = 40\n', encoding="utf-8")
    from_file = describe(wav, models, "--presets", str(presets), "--preset", "warm")
    assert from_file["description"] == flags["description"] and from_file["tokens"] == flags["tokens"]
    assert {k: from_file["settings"][k] for k in ("temperature", "top_p", "top_k", "seed")} == \
           {k: flags["settings"][k] for k in ("temperature", "top_p", "top_k", "seed")}
    # Greedy: the knobs cannot change the sentence, so the record leaves them blank (resume matches).
    greedy = describe(wav, models, "--temperature", "0.7", "--top-p", "0.9", "--top-k", "40")
    plain = describe(wav, models)
    assert greedy["description"] == plain["description"]
    assert greedy["settings"] == plain["settings"]
    assert (plain["settings"]["temperature"], plain["settings"]["top_p"], plain["settings"]["top_k"]) == (None,) * 3


@pytest.mark.parametrize(("args", "message"), [
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--top-k", "-1"], "top_k must be 0 (off) or positive"),
    (["--temperature", "0"], "temperature must be positive"),
    (["--instruction", " "], "instruction must be non-empty text"),
    (["--system", "<|AUDIO|>"], "system must not hold special tokens"),
])
def test_bad_values_are_one_line_errors(wav, args, message):
    result = CliRunner().invoke(app, ["describe", str(wav), *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0
