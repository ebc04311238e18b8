"""The batched loop: each row equals its batch-1 run.

Oracles: `speculative_decode` (batch 1) for every preset and sampling, HF `generate` (the
baselines) for verify=always (≡ cloud-only) and threshold=inf (≡ edge-only). Greedy float32 on the
bundled pair, on every bundled sample and on clips not among them (samples mixed, stretched and
cut: other lengths, other prompts), at several batch sizes. A difference is allowed only at a
near-tie: the model that chose the token had a top-2 margin < 1e-4 (processed scores, uncached
forward) at the first differing step; any such case is printed with its margin."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec_cli.audio import load_audio
from specdec_cli.decoding import DecodingConfig, DecodingRules, generate_baseline, speculative_decode
from specdec_cli.decoding.batch_loop import speculative_decode_batch
from specdec_cli.models import load_pair
from specdec_cli.presets import resolve

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "samples").glob("*.wav"))
NEAR_TIE = 1e-4


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return load_pair()


@pytest.fixture(scope="module")
def sample_audio(pair):
    return {p.name: load_audio(p, 16000, 30) for p in SAMPLES}


@pytest.fixture(scope="module")
def other_audio(sample_audio):
    """Clips that are not bundled samples: two samples overlaid, one slowed down (resampled), one
    cut short, one with noise: new lengths and new prompts for the same speakers' voices."""
    a = list(sample_audio.values())
    rng = np.random.default_rng(7)
    mix = a[0][: min(len(a[0]), len(a[5]))] * 0.7 + a[5][: min(len(a[0]), len(a[5]))] * 0.3
    slow = np.interp(np.arange(0, len(a[2]), 0.8), np.arange(len(a[2])), a[2]).astype(np.float32)
    cut = a[7][: len(a[7]) // 2]
    noisy = (a[4] + 0.02 * rng.standard_normal(len(a[4]))).astype(np.float32)
    return {"mix": mix, "slow": slow, "cut": cut, "noisy": noisy}


def fluent(pair) -> DecodingConfig:
    return DecodingConfig().with_(**resolve("fluent", [pair.presets_file]).values)


def batched(pair, inputs: dict, cfg: DecodingConfig, batch_size: int, **kw) -> dict:
    return dict(speculative_decode_batch(pair.edge, pair.cloud, inputs.items(), cfg, pair.masks, pair.eos_ids,
                                         batch_size, **kw))


def margin_at(model, inputs, prefix: list[int], cfg: DecodingConfig, pair) -> float:
    """Top-2 margin of `model`'s processed scores after prompt + prefix, from an uncached forward."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([prefix], dtype=torch.long)], dim=1)
    kwargs = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
    model.model.rope_deltas = None
    with torch.inference_mode():
        logits = model(**kwargs, use_cache=False).logits[0, -1].float()
    prompt_len = inputs["input_ids"].shape[1]
    rules = DecodingRules.build(cfg, pair.masks, prompt_len, pair.eos_ids)
    top = torch.topk(rules.process_ids(ids[0].tolist(), logits), 2).values
    return float(top[0] - top[1])


def assert_rows_equal(pair, inputs: dict, ours: dict, ref: dict, cfg: DecodingConfig, what: str) -> None:
    """Token-identical rows, or a near-tie at the first difference (printed with its margin)."""
    assert set(ours) == set(ref)
    for key in ref:
        a, b = ref[key].tokens, ours[key].tokens
        if a == b:
            continue
        step = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        margin = min(margin_at(m, inputs[key], a[:step], cfg, pair) for m in (pair.edge, pair.cloud))
        print(f"{what}: {key} differs at step {step}, top-2 margin {margin:.2e}")
        assert margin < NEAR_TIE, f"{what}: {key} differs from its batch-1 run at step {step} (margin {margin:.2e})"


@pytest.mark.parametrize("batch_size", [2, 4, 16])
def test_rows_equal_their_batch_one_runs_on_every_sample_and_other_clips(pair, sample_audio, other_audio, batch_size):
    cfg = fluent(pair)
    inputs = {name: pair.processor(audio) for name, audio in {**sample_audio, **other_audio}.items()}
    ref = {key: speculative_decode(pair.edge, pair.cloud, x, cfg, pair.masks, pair.eos_ids)
           for key, x in inputs.items()}
    ours = batched(pair, inputs, cfg, batch_size)
    assert_rows_equal(pair, inputs, ours, ref, cfg, f"fluent, batch {batch_size}")
    # The counters a record reports are the batch-1 run's too (forwards, tokens fed, prefill).
    assert {k: r.stats for k, r in ours.items()} == {k: r.stats for k, r in ref.items()}
    assert sum(r.stats.escalations for r in ref.values()) > 0  # the cloud had work: verdicts, rollbacks


def test_verify_always_rows_equal_cloud_only_and_threshold_inf_rows_equal_edge_only(pair, sample_audio):
    inputs = {name: pair.processor(audio) for name, audio in sample_audio.items()}
    base = fluent(pair)
    always, never = base.with_(verify="always"), base.with_(threshold=float("inf"))
    cloud_only = {k: generate_baseline(pair.cloud, x, base.with_(mode="cloud"), pair.masks, pair.eos_ids)
                  for k, x in inputs.items()}
    edge_only = {k: generate_baseline(pair.edge, x, base.with_(mode="edge"), pair.masks, pair.eos_ids)
                 for k, x in inputs.items()}
    ours = batched(pair, inputs, always, 4)
    assert_rows_equal(pair, inputs, ours, cloud_only, always, "verify=always vs cloud-only")
    assert any(r.stats.accepted_tokens < r.stats.drafted_tokens for r in ours.values())  # rows rolled back
    assert any(r.stats.accepted_tokens > 0 for r in ours.values())                       # ... while others accepted
    ours = batched(pair, inputs, never, 4)
    assert_rows_equal(pair, inputs, ours, edge_only, never, "threshold=inf vs edge-only")
    assert all(r.stats.cloud_work_forwards == 0 for r in ours.values())


def test_sampled_rows_equal_their_batch_one_runs(pair, sample_audio):
    """Each row draws from its own generator, seeded and consumed as in its batch-1 run, so a
    sampled row is its batch-1 sample (whose exactness test_sampling checks by chi-square)."""
    inputs = {name: pair.processor(audio) for name, audio in sample_audio.items()}
    cfg = fluent(pair).with_(sample=True, temperature=1.5, seed=3)
    ref = {k: speculative_decode(pair.edge, pair.cloud, x, cfg, pair.masks, pair.eos_ids) for k, x in inputs.items()}
    ours = batched(pair, inputs, cfg, 4)
    assert {k: r.tokens for k, r in ours.items()} == {k: r.tokens for k, r in ref.items()}
    greedy = {k: speculative_decode(pair.edge, pair.cloud, x, fluent(pair), pair.masks, pair.eos_ids).tokens
              for k, x in inputs.items()}
    assert any(ours[k].tokens != greedy[k] for k in inputs)  # it did sample


def test_rows_leave_as_they_end_and_waiting_clips_join(pair, sample_audio):
    """Continuous batching: with 2 rows, a clip that ends leaves at once (its result is yielded
    before a longer clip's) and the next clip takes its row while the other row is mid-answer."""
    inputs = {name: pair.processor(audio) for name, audio in sample_audio.items()}
    cfg = fluent(pair).with_(k=1)  # one token per block: the samples' answers differ by a few blocks
    lengths = {k: len(speculative_decode(pair.edge, pair.cloud, x, cfg, pair.masks, pair.eos_ids).events)
               for k, x in inputs.items()}
    order = sorted(lengths, key=lengths.get)
    long, short = order[-1], order[0]
    assert lengths[long] >= lengths[short] + 2
    rest = [k for k in inputs if k not in (long, short)]
    clips = [(k, inputs[k]) for k in [long, short, *rest]]
    blocks: list[str] = []
    ended = [key for key, _ in speculative_decode_batch(pair.edge, pair.cloud, clips, cfg, pair.masks, pair.eos_ids,
                                                        2, on_block=lambda key, _e: blocks.append(key))]
    assert ended.index(short) < ended.index(long)
    assert blocks.index(rest[0]) < len(blocks) - 1 - blocks[::-1].index(long)  # joined while `long` was in flight
    assert sorted(ended) == sorted(inputs)


@pytest.mark.parametrize("mode", ["edge", "cloud"])
def test_one_model_rows_equal_hf_generate(pair, sample_audio, other_audio, mode):
    """`generate_batch` (edge-only / cloud-only in rows) against HF `generate` per clip: tokens and
    the counters a record reports."""
    from specdec_cli.decoding.batch_loop import generate_batch

    cfg = fluent(pair).with_(mode=mode)
    model = pair.cloud if mode == "cloud" else pair.edge
    inputs = {name: pair.processor(audio) for name, audio in {**sample_audio, **other_audio}.items()}
    ref = {k: generate_baseline(model, x, cfg, pair.masks, pair.eos_ids) for k, x in inputs.items()}
    ours = dict(generate_batch(model, inputs.items(), cfg, pair.masks, pair.eos_ids, 5))
    assert_rows_equal(pair, inputs, ours, ref, cfg, f"{mode}-only, batch 5")
    assert {k: r.stats for k, r in ours.items()} == {k: r.stats for k, r in ref.items()}


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="held-out demo clips are synthesised with espeak-ng")
def test_rows_equal_their_batch_one_runs_on_held_out_demo_clips(pair, tmp_path):
    """Held-out clips of the demo corpus (never trained on, not the samples), quality preset."""
    from specdec_cli.demo.heldout import write_heldout

    write_heldout(tmp_path, clips=8, start=3000)
    inputs = {p.name: pair.processor(load_audio(p, 16000, 30)) for p in sorted(tmp_path.glob("*.wav"))}
    cfg = DecodingConfig().with_(**resolve("quality", [pair.presets_file]).values)
    ref = {k: speculative_decode(pair.edge, pair.cloud, x, cfg, pair.masks, pair.eos_ids) for k, x in inputs.items()}
    ours = batched(pair, inputs, cfg, 3)
    assert_rows_equal(pair, inputs, ours, ref, cfg, "held-out, quality, batch 3")
    assert {k: r.stats for k, r in ours.items()} == {k: r.stats for k, r in ref.items()}


def test_sampled_rows_follow_the_cloud_across_vocabulary_widths():
    """Chi-square, as test_sampling's single-clip test, but every sample is a row of one batched
    run (64 in flight, each row its own seed): the edge scores 4 tokens, the cloud 6, so tokens 4
    and 5 come only through the residual; both positions' marginals must match the cloud's."""
    from test_acceptance import CHI2_999, chi2
    from test_sampling import V, soft_table
    from toy import TableLM

    from specdec_cli.decoding import VocabMasks

    edge = TableLM(V)
    edge.table = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * V).log()
    cloud_rows = [[0.05, 0.05, 0.2, 0.1, 0.3, 0.3], [0.1, 0.1, 0.1, 0.1, 0.35, 0.25]] + \
                 [[0.1, 0.2, 0.2, 0.2, 0.2, 0.1]] * 4
    cloud = soft_table(cloud_rows)
    masks = VocabMasks.from_texts(["a", "b", "c", "d", "e", "f"], V)
    inputs = {"input_ids": torch.tensor([[1]]), "attention_mask": torch.tensor([[1]])}
    cfg = DecodingConfig(k=2, max_new_tokens=2, verify="always", sample=True, constraints=False)
    first, second = torch.zeros(V), torch.zeros(V)
    rows = ((seed, inputs) for seed in range(3000))
    for _, result in speculative_decode_batch(edge, cloud, rows, cfg, masks, [99], 64, seeds=lambda key: key):
        first[result.tokens[0]] += 1
        second[result.tokens[1]] += 1
    p1 = torch.tensor(cloud_rows[1])
    p2 = sum(p1[a] * torch.tensor(cloud_rows[a]) for a in range(V))
    assert first[4:].sum() > 0 and second[4:].sum() > 0
    assert chi2(first, p1) < CHI2_999[5]
    assert chi2(second, p2) < CHI2_999[5]


def test_score_drafts_equals_score_draft_per_session(cloud, processor, masks, eos_ids):
    """What a server batching its sessions calls: one forward for sessions that join (lazy
    prefill), catch up on pending tokens, or score a draft right after their kept logits; each
    session's rows and counts equal verifier.score_draft on its own ModelState."""
    from conftest import clip

    from specdec_cli.decoding.batch_loop import score_drafts
    from specdec_cli.decoding.batch_state import BatchState
    from specdec_cli.decoding.state import ModelState
    from specdec_cli.decoding.verifier import score_draft

    cfg = DecodingConfig(max_new_tokens=24)
    clips = {key: processor(clip(seed, seconds)) for key, seed, seconds in (("s1", 1, 0.7), ("s2", 2, 1.1),
                                                                               ("s3", 3, 0.9))}
    batch = BatchState(cloud, "cloud")
    single = {key: ModelState(cloud, key) for key in clips}
    seq = {key: x["input_ids"][0].tolist() for key, x in clips.items()}
    for key, x in clips.items():
        single[key].start(x)
    rounds = [{"s1": ([], [40, 41, 42]), "s2": ([50], [43])},                     # two sessions open
              {"s1": ([44], [45, 46]), "s2": ([], [47, 48, 49]), "s3": ([51, 52], [53])}]  # catch-up, kept logits, a join
    for step in rounds:
        drafts = {}
        for key, (accepted, draft) in step.items():
            seq[key] = seq[key] + accepted
            drafts[key] = (clips[key], list(seq[key]), draft)
        got = score_drafts(batch, drafts)
        for key, (_, sequence, draft) in drafts.items():
            rules = DecodingRules.build(cfg, masks, len(clips[key]["input_ids"][0]), eos_ids)
            fed0, pre0 = single[key].tokens_fed, single[key].prefill_tokens
            want, fed = score_draft(single[key], sequence, draft, rules)
            rows, fed_b, pre_b = got[key]
            assert (rows - want.raw).abs().max() <= 1e-4
            assert (fed_b, pre_b) == (fed, single[key].prefill_tokens - pre0) and fed == single[key].tokens_fed - fed0
            # the verdict keeps the first draft token only: both cut back the same way
            keep = len(sequence) + 1
            batch.rollback(key, keep)
            single[key].rollback(keep)
            seq[key] = sequence + draft[:1]
