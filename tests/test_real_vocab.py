"""The engine on the real Qwen2.5-Omni vocabulary at the real widths.

The `real_pair` fixture (conftest) is the real tokenizer (151,665 tokens) with random thinkers of
151,936 rows (edge, thinker-only folder, as Qwen2.5-Omni-3B) and 152,064 rows (cloud, full-Omni
`thinker.` layout, as Qwen2.5-Omni-7B), loaded back through `load_pair` / `load_model`. Every
check has an independent oracle: an uncached full forward, a fresh prefill, HF `generate`, or the
same command run again.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli_helpers import run_specdec, write_clip
from conftest import clip
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.decoding import DecodingConfig, generate_baseline, speculative_decode
from specdec_cli.decoding.state import ModelState
from specdec_cli.qwen_vocab import BPE_SIZE, CLOUD_VOCAB, EDGE_VOCAB

CLIPS = (0, 1, 2)
KS = (1, 3, 5)
MAX_NEW = 16
# A description as a careful writer would give it, in real Qwen tokens (15 of them).
DESCRIPTION = "说话人是女声，语速较快，音调偏高。"


def rows(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def test_the_pair_has_the_real_widths_and_layouts(real_pair):
    edge_cfg = json.loads((Path(real_pair.edge_id) / "config.json").read_text())
    cloud_cfg = json.loads((Path(real_pair.cloud_id) / "config.json").read_text())
    assert edge_cfg["model_type"] == "qwen2_5_omni_thinker"
    assert cloud_cfg["model_type"] == "qwen2_5_omni"  # the full checkpoint, loaded as its thinker
    assert (rows(real_pair.edge), rows(real_pair.cloud)) == (EDGE_VOCAB, CLOUD_VOCAB)
    assert len(real_pair.tokenizer) == BPE_SIZE + 22 < EDGE_VOCAB
    assert real_pair.eos_ids == [real_pair.tokenizer.convert_tokens_to_ids("<|im_end|>")]


# -- the cache against an uncached forward ---------------------------------------------------------

def full_forward_logits(model, inputs, extra: list[int]) -> torch.Tensor:
    """Logits predicting each of `extra` and the token after, from one forward over prompt +
    extra without a cache (positions computed by the model itself)."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([extra])], dim=1)
    kwargs = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
    model.model.rope_deltas = None
    with torch.inference_mode():
        return model(**kwargs, use_cache=False).logits[0, -len(extra) - 1:].float()


def answer_like(tokenizer, top: int) -> list[int]:
    """Real description tokens, plus ids from the far end of the model's rows (a padding row, the
    last added token) so the cache is checked across the whole embedding."""
    return tokenizer(DESCRIPTION, add_special_tokens=False)["input_ids"][:8] + [top - 1, BPE_SIZE + 21, 9]


@pytest.mark.parametrize("which", ["edge", "cloud"])
def test_incremental_logits_equal_full_forward(which, real_pair):
    model = getattr(real_pair, which)
    inputs = real_pair.processor(clip(5, 0.8))
    extra = answer_like(real_pair.tokenizer, rows(model))
    oracle = full_forward_logits(model, inputs, extra)
    state = ModelState(model)
    steps = [state.prefill(inputs)]
    for chunk in (extra[:1], extra[1:5], extra[5:6], extra[6:]):  # single- and multi-token advances
        steps.extend(state.advance(chunk))
    cached = torch.stack(steps)
    assert cached.shape == oracle.shape == (len(extra) + 1, rows(model))
    assert (cached - oracle).abs().max() <= 1e-4


@pytest.mark.parametrize("which", ["edge", "cloud"])
def test_rollback_equals_fresh_prefill(which, real_pair):
    model = getattr(real_pair, which)
    inputs = real_pair.processor(clip(6, 0.7))
    extra = answer_like(real_pair.tokenizer, rows(model))
    kept, dropped = extra[:4], extra[4:]
    state = ModelState(model)
    state.prefill(inputs)
    prompt_len = len(state)
    state.advance(kept + dropped)
    state.rollback(prompt_len + len(kept))
    fresh = ModelState(model)
    fresh.prefill(inputs)
    fresh.advance(kept)
    assert state.ids == fresh.ids
    nxt, fresh_nxt = state.advance([extra[-1]]), fresh.advance([extra[-1]])
    assert (nxt - fresh_nxt).abs().max() <= 1e-4
    assert (nxt - full_forward_logits(model, inputs, kept + [extra[-1]])[-1:]).abs().max() <= 1e-4


# -- equivalence with HF generate ------------------------------------------------------------------

@pytest.fixture(scope="module", params=[False, True], ids=["constraints-off", "constraints-on"])
def runs(request, real_pair):
    """Per clip: cloud-only and edge-only `generate`, and for each k our verify=always and
    threshold=inf runs."""
    p = real_pair
    out = []
    for seed in CLIPS:
        inputs = p.processor(clip(seed, 0.6 + 0.2 * seed))
        cfg = DecodingConfig(max_new_tokens=MAX_NEW, constraints=request.param)
        cloud_only = generate_baseline(p.cloud, inputs, cfg.with_(mode="cloud"), p.masks, p.eos_ids)
        edge_only = generate_baseline(p.edge, inputs, cfg.with_(mode="edge"), p.masks, p.eos_ids)
        for k in KS:
            always = speculative_decode(p.edge, p.cloud, inputs, cfg.with_(k=k, verify="always"), p.masks, p.eos_ids)
            never = speculative_decode(p.edge, p.cloud, inputs, cfg.with_(k=k, threshold=float("inf")), p.masks,
                                       p.eos_ids)
            out.append((seed, k, always, cloud_only, never, edge_only))
    return request.param, out


def test_verify_always_equals_cloud_only_generate(runs):
    _, results = runs
    for seed, k, always, cloud_only, _, _ in results:
        assert always.tokens == cloud_only.tokens, (seed, k)


def test_threshold_inf_equals_edge_only_generate_without_the_cloud(runs):
    _, results = runs
    for seed, k, _, _, never, edge_only in results:
        assert never.tokens == edge_only.tokens, (seed, k)
        assert never.stats.cloud_calls == 0 and never.stats.cloud_work_tokens == 0


def test_the_equivalence_is_not_vacuous(runs):
    """The random edge and cloud disagree: drafts are rejected and the outputs differ."""
    _, results = runs
    drafted = sum(r[2].stats.verified_drafted for r in results)
    accepted = sum(r[2].stats.verified_accepted for r in results)
    assert accepted < drafted
    assert any(r[3].tokens != r[5].tokens for r in results)
    assert all(len(r[3].tokens) > 1 for r in results)


# Rows past the tokenizer are padding: banned whether or not the constraints are on (with them
# off, a random cloud emits them by chance, and one of its last 128 rows would crash the edge's
# catch-up with an IndexError in the embedding).


def test_only_tokenizer_ids_are_emitted(runs, real_pair):
    """Rows past the tokenizer (151,665..151,935 on the edge, ..152,063 on the cloud) are
    padding: no text, and the edge cannot read the cloud's last 128. None may come out."""
    _, results = runs
    n = len(real_pair.tokenizer)
    for r in results:
        for result in r[2:]:
            assert all(0 <= t < n for t in result.tokens)


@contextlib.contextmanager
def favouring_padding_rows(model, n_tokens: int, scale: float = 4.0) -> Iterator[None]:
    """Temporarily scale the model's output rows past the tokenizer so they win most argmaxes:
    a model that *wants* to emit ids no token has (the random pair does so only by chance)."""
    weight = model.get_output_embeddings().weight
    saved = weight.data[n_tokens:].clone()
    weight.data[n_tokens:] *= scale
    try:
        yield
    finally:
        weight.data[n_tokens:] = saved


@pytest.mark.parametrize("constraints", [False, True],
                         ids=["constraints-off", "constraints-on"])
def test_padding_rows_never_come_out_even_when_favoured(real_pair, constraints):
    p = real_pair
    n = len(p.tokenizer)
    inputs = p.processor(clip(7, 0.7))
    cfg = DecodingConfig(k=3, max_new_tokens=MAX_NEW, constraints=constraints)
    with favouring_padding_rows(p.cloud, n), favouring_padding_rows(p.edge, n):
        outs = [
            generate_baseline(p.cloud, inputs, cfg.with_(mode="cloud"), p.masks, p.eos_ids),
            generate_baseline(p.edge, inputs, cfg.with_(mode="edge"), p.masks, p.eos_ids),
            speculative_decode(p.edge, p.cloud, inputs, cfg.with_(verify="always"), p.masks, p.eos_ids),
            speculative_decode(p.edge, p.cloud, inputs, cfg.with_(threshold=float("inf")), p.masks, p.eos_ids),
            speculative_decode(p.edge, p.cloud, inputs, cfg.with_(verify="always", sample=True, seed=1),
                               p.masks, p.eos_ids),
        ]
    for out in outs:
        assert out.tokens and all(0 <= t < n for t in out.tokens)


# -- sampling across the two widths ----------------------------------------------------------------

def test_sampling_runs_across_the_two_widths(real_pair):
    """Draft distributions are 151,936 wide, the cloud's 152,064: every block is verified by
    rejection sampling across the widths (this crashed with a size mismatch). Same seed, same
    tokens; different seeds, different tokens."""
    p = real_pair
    inputs = p.processor(clip(3, 0.8))
    outs = {}
    for constraints in (False, True):
        for seed in (0, 1, 2):
            cfg = DecodingConfig(k=3, max_new_tokens=MAX_NEW, verify="always", sample=True, seed=seed,
                                 constraints=constraints)
            out = speculative_decode(p.edge, p.cloud, inputs, cfg, p.masks, p.eos_ids)
            assert out.stats.escalations == out.stats.blocks > 0
            assert out.tokens and all(0 <= t < len(p.tokenizer) for t in out.tokens)
            assert speculative_decode(p.edge, p.cloud, inputs, cfg, p.masks, p.eos_ids).tokens == out.tokens
            outs[constraints, seed] = out.tokens
    assert len({tuple(t) for t in outs.values()}) > 1


# -- the CLI on the saved folders ------------------------------------------------------------------

CLI_ARGS = ["--max-new-tokens", "12", "--no-live", "--json", "--k", "3"]


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("real_vocab_clips") / "clip.wav", seconds=0.8, seed=2)


def describe(wav: Path, pair, *extra: str) -> dict:
    result = CliRunner().invoke(app, ["describe", str(wav), "--edge", pair.edge_id, "--cloud", pair.cloud_id,
                                      *CLI_ARGS, *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_describe_json_verify_always_equals_cloud_mode(wav, real_pair):
    always = describe(wav, real_pair, "--verify", "always")
    cloud = describe(wav, real_pair, "--mode", "cloud")
    assert always["tokens"] > 0 and always["error"] is None
    assert always["description"] == cloud["description"]


def test_cli_sample_in_process_and_in_a_real_process(wav, real_pair):
    """`--sample` end to end: it exited 1 with a tensor size mismatch on this pair. The in-process
    run and an installed `specdec` process with the same seed give the same record."""
    args = ["--verify", "always", "--sample", "--seed", "5"]
    inproc = describe(wav, real_pair, *args)
    assert inproc["tokens"] > 0 and inproc["error"] is None
    proc = run_specdec("describe", str(wav), "--edge", real_pair.edge_id, "--cloud", real_pair.cloud_id,
                       *CLI_ARGS, *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert (record["description"], record["tokens"]) == (inproc["description"], inproc["tokens"])
