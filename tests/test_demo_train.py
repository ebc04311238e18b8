"""The v2 demo trainer: a paused-and-resumed run equals an uninterrupted one (weights, optimizer,
eval history), and a state from another recipe is refused. Runs on a tiny fake corpus in the v2
shard format (random log-mels), so it needs neither espeak-ng nor the built corpus."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from specdec_cli.demo.corpus import TEMPLATES, bucket_of, describe, sample_labels
from specdec_cli.demo.train import Recipe, train

TINY = Recipe(size=dict(hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, audio_d=32, audio_layers=1, audio_heads=2,
                        audio_ffn=64, dropout=0.1, text_dropout=0.0),
              steps=7, lr=3e-3, batch=4, warmup=2, eval_every=3)


def _shard(root, name: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    feats, metas, off = [], [], 0
    for i in range(n):
        frames = rng.randint(30, 90)
        labels = sample_labels(rng)
        template = rng.randrange(len(TEMPLATES))
        chars = rng.randint(4, 40)
        feats.append(np.random.default_rng(seed * 100 + i).standard_normal((frames, 128)).astype(np.float16))
        metas.append({"labels": labels, "template": template, "offset": off, "frames": frames,
                      "bucket": bucket_of(chars), "target": describe(labels, template)})
        off += frames
    np.save(root / f"{name}.npy", np.concatenate(feats))
    (root / f"{name}.json").write_text(json.dumps(metas, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    _shard(root, "train-000", 6, 1)
    _shard(root, "train-001", 5, 2)
    _shard(root, "val-000", 6, 3)
    _shard(root, "val_noisy-000", 6, 4)
    return root


def _quiet(_msg: str) -> None:
    pass


def test_paused_and_resumed_run_equals_uninterrupted(corpus, tmp_path):
    full = train("tiny", TINY, tmp_path / "a", corpus, log=_quiet)
    # Pause after 4 steps (mid-epoch: 11 clips make 2 batches of 4 per epoch), then resume twice.
    train("tiny", TINY, tmp_path / "b", corpus, stop_after=4, log=_quiet)
    mid = torch.load(tmp_path / "b" / "state.pt", weights_only=False)
    assert mid["step"] == 4 and mid["epoch"] == 1
    train("tiny", TINY, tmp_path / "b", corpus, stop_after=1, log=_quiet)
    resumed = train("tiny", TINY, tmp_path / "b", corpus, log=_quiet)
    assert resumed["step"] == full["step"] == TINY.steps
    for k, v in full["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    exp_avg = [s["exp_avg"] for s in full["optimizer"]["state"].values()]
    got = [s["exp_avg"] for s in resumed["optimizer"]["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(exp_avg, got, strict=True))
    assert [h["step"] for h in resumed["history"]] == [3, 6, 7]
    assert resumed["history"] == full["history"]
    assert set(full["history"][-1]["val"]["acc"]) >= {"all"} and "val_noisy" in full["history"][-1]


def test_state_from_another_recipe_is_refused(corpus, tmp_path):
    train("tiny", TINY, tmp_path, corpus, stop_after=1, log=_quiet)
    with pytest.raises(SystemExit, match="another recipe"):
        train("tiny", replace(TINY, lr=1e-3), tmp_path, corpus, log=_quiet)


def test_export_loads_like_a_bundled_model(corpus, tmp_path):
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer
    from specdec_cli.demo.train import export
    from specdec_cli.processor import AudioTextProcessor

    st = train("tiny", TINY, tmp_path / "run", corpus, stop_after=2, log=_quiet)
    export(tmp_path / "run", tmp_path / "model")
    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tmp_path / "model")
    proc = AudioTextProcessor.from_pretrained(tmp_path / "model")
    assert proc.tokenizer.get_vocab() == build_qwen_style_tokenizer().get_vocab()
    for k, v in st["model"].items():
        assert torch.equal(v, model.state_dict()[k]), k


# --- distillation (issue 34) -------------------------------------------------------------------
def test_kl_topk_equals_a_hand_computed_value():
    import math

    from specdec_cli.demo.train import kl_topk

    student = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    top_val, top_idx = torch.tensor([[3.0, 1.0]]), torch.tensor([[3, 0]], dtype=torch.int16)
    T = 2.0
    # teacher at T over its top-2, renormalised: softmax([1.5, 0.5]); student at T over all 4 ids
    pt = [math.exp(1.5) / (math.exp(1.5) + math.exp(0.5)), math.exp(0.5) / (math.exp(1.5) + math.exp(0.5))]
    z = sum(math.exp(x / T) for x in (1.0, 0.0, -1.0, 2.0))
    ps = [math.exp(2.0 / T) / z, math.exp(1.0 / T) / z]
    want = T * T * sum(p * math.log(p / q) for p, q in zip(pt, ps, strict=True))
    got = float(kl_topk(student, top_val, top_idx, T)[0])
    assert got == pytest.approx(want, rel=1e-6)
    # a student equal to the teacher on the teacher's support, with nothing elsewhere: zero
    same = torch.tensor([[1.0, -1e9, -1e9, 3.0]])
    assert float(kl_topk(same, top_val, top_idx, T)[0]) == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory):
    from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer
    from specdec_cli.demo.train import build_model

    folder = tmp_path_factory.mktemp("teacher")
    build_model(replace(TINY, seed=5), build_qwen_style_tokenizer()).save_pretrained(folder)
    return folder


DISTILLED = replace(TINY, steps=8, smooth=0.0, distill=dict(teacher="t", weight=0.5, temperature=2.0, top_k=4,
                                                             onpolicy_from=3, round_every=3, round_clips=3,
                                                             onpolicy_every=2))


def test_distilled_run_pauses_and_resumes_exactly_with_onpolicy_rounds(corpus, tiny_teacher, tmp_path):
    kw = dict(log=_quiet, teacher_dir=tiny_teacher, cache_dir=tmp_path / "cache")
    full = train("d", DISTILLED, tmp_path / "a", corpus, **kw)
    assert full["pool"]["round"] == 1 and len(full["pool"]["answers"]) == 3  # steps 3, 5 (round 0), 7 (round 1)
    assert len(list((tmp_path / "cache").glob("teacher-*.pt"))) == 1
    # paused in the middle of round 0's pool and again right before round 1 is drawn
    train("d", DISTILLED, tmp_path / "b", corpus, stop_after=4, **kw)
    train("d", DISTILLED, tmp_path / "b", corpus, stop_after=2, **kw)
    resumed = train("d", DISTILLED, tmp_path / "b", corpus, **kw)
    assert resumed["step"] == full["step"] == DISTILLED.steps
    for k, v in full["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    assert resumed["pool"]["answers"] == full["pool"]["answers"]
    assert resumed["history"] == full["history"]
    assert resumed["identity"]["teacher"] == full["identity"]["teacher"]
    logged = [json.loads(x) for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert [r["onpolicy_round"] for r in logged if "onpolicy_round" in r] == [0, 1]


def test_distilled_state_refuses_another_teacher(corpus, tiny_teacher, tmp_path):
    from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer
    from specdec_cli.demo.train import build_model

    kw = dict(log=_quiet, cache_dir=tmp_path / "cache")
    train("d", DISTILLED, tmp_path / "run", corpus, stop_after=1, teacher_dir=tiny_teacher, **kw)
    other = tmp_path / "other"
    build_model(replace(TINY, seed=6), build_qwen_style_tokenizer()).save_pretrained(other)
    with pytest.raises(SystemExit, match="another teacher"):
        train("d", DISTILLED, tmp_path / "run", corpus, teacher_dir=other, **kw)


def test_a_shortened_schedule_keeps_the_onpolicy_phase_at_the_same_fraction():
    from specdec_cli.demo.train import RECIPES, shortened

    r = shortened(RECIPES["edge_v4"], 1000)  # 2500 steps, on-policy from 1250, a round every 250
    assert (r.steps, r.eval_every) == (1000, 500)
    assert (r.distill["onpolicy_from"], r.distill["round_every"]) == (500, 100)
    assert RECIPES["edge_v4"].distill["onpolicy_from"] == 1250  # the recipe itself is untouched
    assert shortened(RECIPES["cloud_v4"], 100).distill is None and shortened(RECIPES["cloud_v4"], 100).eval_every == 100


# --- the ears' supervision (issue 41: cloud_v4's audio tower kept no pitch) ----------------------
def _with_measures(root, out):
    """A copy of the tiny corpus whose clips carry measures and a gender label, as corpus v4's do."""
    out.mkdir()
    rng = random.Random(5)
    for path in root.glob("*.json"):
        metas = json.loads(path.read_text(encoding="utf-8"))
        for m in metas:
            m["measures"] = {"f0_hz": rng.uniform(90, 300), "rate": rng.uniform(2, 7), "level_dbfs": rng.uniform(-40, -12),
                             "pause_share": rng.uniform(0, 0.3)}
        (out / path.name).write_text(json.dumps(metas, ensure_ascii=False), encoding="utf-8")
        (out / path.with_suffix(".npy").name).write_bytes(path.with_suffix(".npy").read_bytes())
    return out


def test_ear_targets_are_the_measures_standardised_by_hand():
    from specdec_cli.demo.train import EarHead

    meta = {"measures": {"f0_hz": 240.0, "rate": 5.9, "level_dbfs": -17.0, "pause_share": 0.18},
            "labels": {"gender": "女声"}}
    got = EarHead.targets(meta, {"男声": 120.0, "女声": 220.0})
    semitones = 12 * np.log2(240 / 220)  # 1.506
    want = [semitones / 4, (np.log(240) - np.log(165)) / 0.5, (5.9 - 4.4) / 1.5, (-17 + 25) / 8, (0.18 - 0.08) / 0.1, 1.0]
    assert got == pytest.approx(want)


def test_ear_head_reads_the_mean_of_each_clips_audio_tower_output(corpus, tmp_path):
    from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer
    from specdec_cli.demo.train import AttributeSpans, Corpus, EarHead, build_model, model_inputs
    from specdec_cli.processor import audio_token_count

    root = _with_measures(corpus, tmp_path / "c")
    tok = build_qwen_style_tokenizer()
    data = Corpus("train", tok, AttributeSpans(tok), root)
    model = build_model(TINY, tok).eval()
    head = EarHead(model, TINY.size["hidden"])
    b = data.batch([0, 3, 5])
    with torch.no_grad():
        model(**model_inputs(b))
        counts = [int(n) for n in b["feature_attention_mask"].sum(1)]
        captured = torch.split(head._out, [audio_token_count(n) for n in counts])
        # Oracle: the audio tower run alone on each clip's own (unpadded) features.
        for row, (clip, h) in enumerate(zip(b["clips"], captured, strict=True)):
            alone = model.get_audio_features(data.features(clip)[None],
                                             feature_attention_mask=torch.ones((1, counts[row]), dtype=torch.long))
            torch.testing.assert_close(h.mean(0), alone.last_hidden_state.mean(0), rtol=1e-4, atol=1e-5)


def test_a_run_with_ears_resumes_exactly_and_exports_a_plain_thinker(corpus, tmp_path):
    from specdec_cli.demo.train import export

    root = _with_measures(corpus, tmp_path / "c")
    recipe = replace(TINY, ears={"weight": 0.3})
    full = train("tiny", recipe, tmp_path / "a", root, log=_quiet)
    train("tiny", recipe, tmp_path / "b", root, stop_after=4, log=_quiet)
    resumed = train("tiny", recipe, tmp_path / "b", root, log=_quiet)
    for k, v in full["ears"].items():
        assert torch.equal(v, resumed["ears"][k]), k
    for k, v in full["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    plain = train("tiny", TINY, tmp_path / "p", root, log=_quiet)  # the ears' loss changes the weights
    assert not all(torch.equal(v, plain["model"][k]) for k, v in full["model"].items())
    export(tmp_path / "a", tmp_path / "model")
    from safetensors.torch import load_file

    keys = load_file(tmp_path / "model" / "model.safetensors").keys()
    assert keys and not any(k.split(".")[0] == "read" or ".read." in k for k in keys)


def test_a_distilled_run_with_ears_resumes_exactly(corpus, tiny_teacher, tmp_path):
    # edge_v4's combination: the teacher's top-k, on-policy rounds (no labels, so no ears' loss on
    # those steps) and the ears' loss on the labelled ones.
    from specdec_cli.demo.train import RECIPES

    assert RECIPES["edge_v4"].ears and RECIPES["edge_v4"].distill
    root = _with_measures(corpus, tmp_path / "c")
    recipe = replace(DISTILLED, ears={"weight": 0.3})
    kw = dict(log=_quiet, teacher_dir=tiny_teacher, cache_dir=tmp_path / "cache")
    full = train("d", recipe, tmp_path / "a", root, **kw)
    train("d", recipe, tmp_path / "b", root, stop_after=4, **kw)
    resumed = train("d", recipe, tmp_path / "b", root, **kw)
    for part in ("model", "ears"):
        for k, v in full[part].items():
            assert torch.equal(v, resumed[part][k]), (part, k)
    plain = train("d", DISTILLED, tmp_path / "p", root, **kw)  # the ears' loss changes the weights
    assert not all(torch.equal(v, plain["model"][k]) for k, v in full["model"].items())


def test_history_json_is_the_runs_evals_and_renders_as_the_docs_quote_them(corpus, tmp_path):
    from test_doc_tables import tables_module

    from specdec_cli.demo.train import main

    st = train("edge", TINY, tmp_path / "edge", corpus, log=_quiet)
    out = tmp_path / "h.json"
    main(["edge", "--runs", str(tmp_path), "--history-json", str(out)])  # ("edge" only names the folder)
    h = json.loads(out.read_text(encoding="utf-8"))
    assert h["step"] == TINY.steps and h["steps"] == TINY.steps and [e["step"] for e in h["evals"]] == [3, 6, 7]
    assert json.loads(json.dumps(st["history"])) == h["evals"]
    dt = tables_module()
    curve = dt.training_curve(h)
    assert curve[0] == "| step (of 7) | training voices | training voices, noisy |"
    want = [f"| {e['step']} | {100 * e['val']['acc']['all']['mean']:.1f} | {100 * e['val_noisy']['acc']['all']['mean']:.1f} |"
            for e in h["evals"]]
    assert curve[2:] == want
    final = dt.training_final(h)
    last = h["evals"][-1]["val"]["acc"]["all"]
    assert final[2] == ("| training voices (6) | " + " | ".join(f"{100 * last[a]:.1f}" for a in
                        ("gender", "rate", "pitch", "volume", "pauses", "emotion")) + f" | {100 * last['mean']:.1f} |")


# --- demo pair v5 (issue 51): warm starts, held-out attributes left out ---------------------------
def test_a_warm_start_begins_from_the_named_runs_weights_and_is_part_of_the_identity(corpus, tmp_path):
    base = train("base", TINY, tmp_path / "runs" / "base", corpus, log=_quiet)
    warm = replace(TINY, init="base", steps=2, eval_every=2)
    # zero steps: the model is the base run's, bit for bit
    st = train("warm", warm, tmp_path / "runs" / "warm", corpus, stop_after=0, log=_quiet, init_runs=tmp_path / "runs")
    for k, v in base["model"].items():
        assert torch.equal(v, st["model"][k]), k
    assert st["identity"]["init"] and st["identity"]["recipe"]["init"] == "base"
    # a resume keeps its own weights (not the base's again), and another base is refused
    st = train("warm", warm, tmp_path / "runs" / "warm", corpus, stop_after=1, log=_quiet, init_runs=tmp_path / "runs")
    assert st["step"] == 1 and not all(torch.equal(v, st["model"][k]) for k, v in base["model"].items())
    train("base", replace(TINY, lr=2e-3), tmp_path / "other" / "base", corpus, log=_quiet)
    with pytest.raises(SystemExit, match="another init"):
        train("warm", warm, tmp_path / "runs" / "warm", corpus, log=_quiet, init_runs=tmp_path / "other")
    # a run started from scratch differs from the warm one at step 0
    cold = train("cold", TINY, tmp_path / "cold", corpus, stop_after=0, log=_quiet)
    assert not all(torch.equal(v, cold["model"][k]) for k, v in base["model"].items())


def test_held_out_attributes_left_out_are_not_scored(corpus, tmp_path):
    """evaluate_tf over a set where some clips leave an attribute out: each attribute is scored over
    the clips labelled for it (the counts hand-computed from the shard), and the scores are those of
    the same clips with that attribute dropped from the set."""
    from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer
    from specdec_cli.demo.train import AttributeSpans, Corpus, build_model, evaluate_tf

    root = tmp_path / "c"
    root.mkdir()
    _shard(root, "val-000", 6, 3)
    metas = json.loads((root / "val-000.json").read_text(encoding="utf-8"))
    full = [dict(m, labels=dict(m["labels"])) for m in metas]
    for k in (1, 4):  # two clips leave rate out, one pitch too
        del metas[k]["labels"]["rate"]
    del metas[4]["labels"]["pitch"]
    (root / "val-000.json").write_text(json.dumps(metas, ensure_ascii=False), encoding="utf-8")
    tok = build_qwen_style_tokenizer()
    model = build_model(TINY, tok)
    got = evaluate_tf(model, Corpus("val", tok, AttributeSpans(tok), root))
    assert got["clips"] == 6 and got["scored"]["rate"] == 4 and got["scored"]["pitch"] == 5
    assert got["scored"]["gender"] == 6
    # the oracle: each attribute's accuracy over the fully labelled copy of the clips it was scored on
    (root / "val-000.json").write_text(json.dumps(full, ensure_ascii=False), encoding="utf-8")
    hits = []
    for i in (0, 2, 3, 5):
        (root / "val-000.json").write_text(json.dumps([full[i]], ensure_ascii=False), encoding="utf-8")
        hits.append(evaluate_tf(model, Corpus("val", tok, AttributeSpans(tok), root))["acc"]["all"]["rate"])
    assert got["acc"]["all"]["rate"] == pytest.approx(sum(hits) / 4)
