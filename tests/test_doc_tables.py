"""bench/doc_tables.py: a docs table drawn from a JSON must still say what the JSON says (issue 34,
item 4). The check over the real pages, and on a page of its own that it fails when the JSON moves
and passes again once the table is rewritten."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tables_module():
    spec = importlib.util.spec_from_file_location("doc_tables_bench", ROOT / "bench/doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_marked_docs_table_matches_its_json():
    assert tables_module().stale() == []


def test_the_demo_pair_and_gate_signal_tables_are_marked():
    """Removing a marker would switch the check off for that table: the ones issue 34 regenerates
    stay marked."""
    dt = tables_module()
    marked = {(str(t.page.relative_to(ROOT)), t.renderer) for p in dt.pages() for t in dt.tables(p)}
    assert {("docs/demo-pair.md", "demo_models"), ("docs/meaning-gate.md", "gate_signal"),
            ("docs/meaning-gate.md", "gate_signal_v2"), ("docs/meaning-gate.md", "gate_signal_noised"),
            ("docs/meaning-gate.md", "gate_signal_goal"), ("docs/meaning-gate.md", "gate_signal_before_after"),
            ("docs/meaning-gate.md", "gate_signal_attributes"), ("docs/meaning-gate.md", "frugal_origin"),
            ("docs/meaning-gate.md", "gate_choices"), ("docs/meaning-gate.md", "gate_choices_calibration")} <= marked
    assert {("docs/meaning-gate.md", "gate_signal_noised"), ("docs/demo-pair.md", "entropy_curve"),
            ("docs/demo-pair.md", "calibration_presets"), ("docs/demo-pair.md", "calibration_entropy"),
            ("docs/demo-pair.md", "calibration_meaning"), ("specdec_cli/demo/models/PRESETS.md", "calibration_presets"),
            ("docs/calibrate.md", "calibration_presets"), ("docs/usage.md", "bundled_presets")} <= marked
    # docs/benchmarks.md: every section that quotes the demo pair
    assert {("docs/benchmarks.md", r) for r in ("eval_modes", "bench_identity", "bench_gated", "bench_cloud_work",
                                                 "batched", "remote", "server_batching", "server_batching_wider",
                                                 "server_windows", "loop_overhead", "ray_batch",
                                                 "ray_batch_cli")} <= marked
    assert ("docs/capacity.md", "capacity_model") in marked
    assert {("docs/demo-pair.md", "training_curve"), ("docs/demo-pair.md", "training_final")} <= marked
    assert "docs/eval-samples.md" in dt.GENERATED_PAGES


def test_a_generated_page_is_checked_whole_and_rewritten(tmp_path):
    """docs/eval-samples.md is the Markdown `specdec eval --report` writes: a figure edited by hand
    on the page, or a JSON rerun without the page, is caught; --write makes it the library's again."""
    from specdec_cli.evaluate import markdown

    dt = tables_module()
    report = json.loads((ROOT / "docs/results/eval-samples.json").read_text(encoding="utf-8"))
    (tmp_path / "docs/results").mkdir(parents=True)
    (tmp_path / "docs/results/eval-samples.json").write_text(json.dumps(report), encoding="utf-8")
    page = tmp_path / "docs/eval-samples.md"
    page.write_text(markdown(report), encoding="utf-8")
    assert dt.stale(tmp_path) == []
    page.write_text(markdown(report).replace("| cloud | ", "| cloud | 1", 1), encoding="utf-8")
    problems = dt.stale(tmp_path)
    assert len(problems) == 1 and problems[0].startswith("docs/eval-samples.md: differs from docs/results/eval-samples.json")
    assert dt.write(tmp_path) == ["docs/eval-samples.md"]
    assert page.read_text(encoding="utf-8") == markdown(report) and dt.stale(tmp_path) == []
    moved = copy.deepcopy(report)
    moved["modes"][0]["mean_accuracy"] = 0.5
    (tmp_path / "docs/results/eval-samples.json").write_text(json.dumps(moved), encoding="utf-8")
    assert len(dt.stale(tmp_path)) == 1


def test_the_presets_tables_json_is_the_run_that_wrote_the_bundled_presets():
    """docs/results/presets-calibration.json (what the demo pair's presets tables are drawn from) and the
    bundled presets file come from one `make presets` run: every preset the file holds is the
    setting the JSON marks chosen, with the scores the file's comments give (tests/cli_helpers.py);
    and the two bundled copies are the same file."""
    from cli_helpers import report_matches_presets

    models = ROOT / "specdec_cli/demo/models"
    text = (models / "edge/specdec_presets.toml").read_text(encoding="utf-8")
    assert (models / "cloud/specdec_presets.toml").read_text(encoding="utf-8") == text
    report = json.loads((ROOT / "docs/results/presets-calibration.json").read_text(encoding="utf-8"))
    report_matches_presets(report, text)


def _setting(name: str, mode: str = "spec", k: int = 6, verify: str = "entropy", chosen: tuple[str, ...] = (),
             q: float = 90.0, rate: float = 0.1, **kw) -> dict:
    return {"name": name, "mode": mode, "k": k, "verify": verify, **kw, "chosen": list(chosen),
            "calibration": {"quality": q, "call_rate": rate}, "check": {"quality": q - 1, "call_rate": rate / 2}}


def test_the_calibration_renderers_order_name_and_mark_settings_as_calibrate_does():
    """A hand-made report: baselines first, then the entropy sweep by k and threshold (JSON null = inf),
    then the meaning sweep; the chosen rows bold with their presets; the presets table takes frugal's
    clips at home from the gate and compares each check half with cloud-only's."""
    dt = tables_module()
    half = {"quality": 95.0, "call_rate": 0.05, "zero_cloud_share": 0.25, "work_per_clip": 10.0}
    report = {"measure": "m", "n_calib": 2, "n_check": 2, "settings": [
        _setting("k=6 t=inf", threshold=None, q=80.0, rate=0.0), _setting("m", verify="meaning", gate_upload=0.5,
                                                                          gate_verify=0.25, chosen=("frugal",)),
        _setting("k=6 t=0.5", threshold=0.5, chosen=("quality", "fluent")), _setting("k=4 t=0", k=4, threshold=0.0),
        _setting("cloud-only", "cloud", q=99.0, rate=0.9), _setting("edge-only", "edge", q=80.0, rate=0.0),
        _setting("k=6 t=0", threshold=0.0, q=99.0, rate=0.2)],
        "choices": [{"name": "quality", "points": 1.0, "met": True, "setting": "k=6 t=0.5"},
                    {"name": "fluent", "points": 3.0, "met": True, "setting": "k=6 t=0.5"}],
        "gate": {"name": "frugal", "met": True, "points": 1.0, "setting": "m", "calibration": half, "check": dict(half, zero_cloud_share=0.5)}}
    sweep = dt.calibration_sweep(report)
    assert [r.split(" | ")[0] for r in sweep[2:]] == [
        "| cloud-only", "| edge-only", "| k 4 · t 0.0", "| k 6 · t 0.0", "| **k 6 · t 0.5**", "| k 6 · t inf",
        "| **k 6 · 0.5/0.25**"]
    assert sweep[6] == "| **k 6 · t 0.5** | 0.100 | 90.0 | 0.050 | 89.0 | quality, fluent |"
    assert len(dt.calibration_entropy(report)) == 2 + 6 and len(dt.calibration_meaning(report)) == 2 + 3
    chosen = dt.calibration_presets(report)
    assert chosen[2:] == [
        "| cloud-only | — | 0.900 / 0.450 | 99.0 / 98.0 | 0.0 | 0 / 0 % |",
        "| edge-only | — | 0.000 / 0.000 | 80.0 / 79.0 | \u221219.0 | 100 / 100 % |",
        "| **quality** | k 6 · t 0.5 | 0.100 / 0.050 | 90.0 / 89.0 | \u22129.0 |  |",
        "| **fluent** | k 6 · t 0.5 | 0.100 / 0.050 | 90.0 / 89.0 | \u22129.0 |  |",
        "| **frugal** | k 6 · 0.5/0.25 | 0.100 / 0.050 | 90.0 / 89.0 | \u22129.0 | 25.0 / 50.0 % |",
        "| every block verified | k 6 · t 0.0 | 0.200 / 0.100 | 99.0 / 98.0 | 0.0 |  |"]
    listed = dt.bundled_presets(report)
    assert [r.split(" | ")[:3] for r in listed[2:]] == [["| quality", "0.5", "6"], ["| fluent", "0.5", "6"],
                                                         ["| frugal", "0.5 (fluent's, for another task)", "6"]]
    assert "`gate_upload` 0.5, `gate_verify` 0.25" in listed[-1] and "25.0 / 50.0 %" in listed[-1]
    report["gate"]["met"] = False  # no frugal written: no frugal row
    assert not any("frugal" in r for r in dt.calibration_presets(report)[2:] + dt.bundled_presets(report)[2:])
    # quality shown within nothing (calibrate's fallback: threshold 0, every block verified)
    report["choices"][0].update(met=False, setting="k=6 t=0")
    assert dt.calibration_presets(report)[4].startswith(
        "| **quality** (none shown within its points: every block verified) | k 6 · t 0.0 |")
    assert dt.bundled_presets(report)[2] == ("| quality | 0.0 | 6 | entropy | none shown within 1 point(s) of "
                                             "cloud-only: every block verified |")


def test_the_entropy_curve_table_is_report_jsons():
    dt = tables_module()
    report = json.loads((ROOT / "specdec_cli/demo/models/report.json").read_text(encoding="utf-8"))
    rows = dt.entropy_curve(report)
    curve = report["entropy_curve"]
    assert len(rows) == 2 + len(curve["deciles"]) + 1
    top = curve["deciles"][-1]
    assert rows[-2].startswith(f"| {top['decile']} |") and rows[-2].endswith(f"| {100 * top['disagree_rate']:.1f} % |")
    assert f"{curve['tokens']:,}" in rows[-1]


def _page(root: Path, run: dict) -> Path:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs/run.json").write_text(json.dumps(run), encoding="utf-8")
    page = root / "docs/page.md"
    page.write_text("# A page\n\nSome prose.\n\n<!-- table: gate_signal_noised docs/run.json -->\n\n"
                    "| old |\n|---|\n\nMore prose.\n", encoding="utf-8")
    return page


def test_a_moved_figure_is_caught_and_rewritten(tmp_path, monkeypatch):
    dt = tables_module()
    monkeypatch.setattr(dt, "PAGES", ("docs/*.md",))
    run = json.loads((ROOT / "docs/results/bench-gate-signal-noised.json").read_text(encoding="utf-8"))
    page = _page(tmp_path, run)
    assert len(dt.stale(tmp_path)) == 1  # the placeholder table is not what the JSON says
    assert dt.write(tmp_path) == [f"{page}:5"]
    assert dt.stale(tmp_path) == []
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# A page\n\nSome prose.\n\n<!-- table:") and text.endswith("|\n\nMore prose.\n")
    # the measurement set's confidence AUC moves: the table no longer matches until rewritten
    moved = copy.deepcopy(run)
    moved["measurement"]["signals"]["confidence"]["auc"] = 0.912
    (tmp_path / "docs/run.json").write_text(json.dumps(moved), encoding="utf-8")
    problems = dt.stale(tmp_path)
    assert len(problems) == 1 and "docs/page.md:5" in problems[0] and "row 3" in problems[0]
    dt.write(tmp_path)
    assert "| `confidence` | 0.86 / 0.91 |" in page.read_text(encoding="utf-8")
    assert dt.stale(tmp_path) == []


def test_an_unknown_renderer_or_missing_json_is_a_one_line_error(tmp_path):
    dt = tables_module()
    page = _page(tmp_path, {})
    table = dt.tables(page)[0]
    with pytest.raises(SystemExit, match="no renderer 'nope'"):
        dt.render(dataclasses.replace(table, renderer="nope"), tmp_path)
    with pytest.raises(SystemExit, match="docs/gone.json does not exist"):
        dt.render(dataclasses.replace(table, sources=("docs/gone.json",)), tmp_path)


def test_signed_writes_the_docs_minus_and_no_negative_zero():
    dt = tables_module()
    assert [dt.signed(x) for x in (0.87, -1.74, -0.04, 0.0)] == ["+0.9", "\u22121.7", "0.0", "0.0"]


def test_the_benchmark_renderers_quote_their_json():
    """Independent of the renderers' own arithmetic: cells read back against the JSON's values."""
    dt = tables_module()
    run = {"cloud_rtt_ms": 50.0, "modes": {}}
    for key in (*dt.BENCH_PLAIN, *dt.BENCH_RULES):
        cloud_only = key in ("plain_cloud_generate", "cloud")
        run["modes"][key] = {"cloud_prefill_tokens_per_clip": 0.0 if key == "edge" else 200.0,
                             "cloud_work_tokens_per_clip": 250.0 if cloud_only else (0.0 if key == "edge" else 275.0),
                             "cloud_work_forwards_per_clip": 25.0 if cloud_only else (0.0 if key == "edge" else 5.0),
                             "no_cloud_share": 1.0 if key == "edge" else 0.25 if key == "quality" else 0.0}
    rows = {r.split(" | ")[0].lstrip("| "): r for r in dt.bench_cloud_work(run)[2:]}
    assert rows["quality"] == "| quality | 200.0 | 275.0 | 5.00 | 1.10 | 0.20 | 25 % |"
    assert rows["edge-only"] == "| edge-only | 0.0 | 0.0 | 0.00 | 0.00 | 0.00 | 100 % |"
    remote = json.loads((ROOT / "docs/results/bench-remote.json").read_text(encoding="utf-8"))
    table = dt.remote(remote)
    m = remote["modes"]["quality"]
    row = next(r for r in table if r.startswith("| quality |"))
    assert f"{m['round_trips']:.2f} | {m['cloud_calls']:.2f}" in row
    assert row.endswith(f"{m['remote_s']['50ms']:.3f} / {m['predicted_s']['50ms']:.3f} |")
    assert len(table) == 2 + len(remote["modes"]) and table[0].count("|") == table[1].count("|")


def test_the_command_checks_the_repository():
    run = subprocess.run([sys.executable, str(ROOT / "bench/doc_tables.py")], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "marked tables match their JSON" in run.stdout


def examples_module():
    spec = importlib.util.spec_from_file_location("doc_examples_bench", ROOT / "bench/doc_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_api_output_is_rewritten_from_a_run(tmp_path):
    """bench/doc_examples.py on a README of its own (an example that needs no model, reading a file
    relative to the checkout as the real one reads samples/): a stale output block is caught and
    replaced by what the code prints; the rest of the README is kept byte for byte. The real
    README's example is run against its output by tests/test_api.py."""
    de = examples_module()
    (tmp_path / "data.txt").write_text("说话人是女声\n", encoding="utf-8")
    head = "# x\n\n## Python API\n\nProse.\n\n<!-- --8<-- [start:api] -->\n```python\n"
    code = "from pathlib import Path\nprint(Path('data.txt').read_text(encoding='utf-8').strip())\nprint(1 + 1, 'blocks')\n"
    tail = "```\n<!-- --8<-- [end:api] -->\n\n## Next\n\n```text\nnot this one\n```\n"
    (tmp_path / "README.md").write_text(head + code + "```\n\nOutput:\n\n```text\n说话人是男声\n3 blocks\n" + tail,
                                        encoding="utf-8")
    assert de.check(tmp_path) is not None
    assert de.write(tmp_path) is True
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == (
        head + code + "```\n\nOutput:\n\n```text\n说话人是女声\n2 blocks\n" + tail)
    assert de.check(tmp_path) is None and de.write(tmp_path) is False
    (tmp_path / "README.md").write_text("# x\n\n## Python API\n\nno example\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="lost its"):
        de.check(tmp_path)

def _signals(**aucs):
    """A bench/gate_signal.py set with the given signals: name=(auc, auc_se, kept 20 %, kept 30 %)."""
    return {name: {"auc": a, "auc_se": se, "kept_vs_cloud_points": {"10%": 0.0, "20%": k20, "30%": k30}}
            for name, (a, se, k20, k30) in aucs.items()}


def test_gate_signal_goal_names_the_best_fresh_signal_and_says_whether_it_is_met():
    dt = tables_module()
    run = {"calibration": {"signals": _signals(confidence=(0.71, 0.04, 0, 0), probe=(0.69, 0.04, 0, 0))},
           "measurement": {"signals": _signals(confidence=(0.687, 0.05, 0, 0), probe=(0.828, 0.0408, 0, 0))}}
    assert dt.gate_signal_goal(run)[2] == "| `probe` | 0.83 ± 0.04 | 0.69 | ≥ 0.85 | **no** |"
    run["measurement"]["signals"]["confidence"]["auc"] = 0.851
    assert dt.gate_signal_goal(run)[2] == "| `confidence` | 0.85 ± 0.05 | 0.71 | ≥ 0.85 | yes |"


def test_gate_signal_before_after_pairs_the_fresh_set_of_both_runs():
    dt = tables_module()

    def run(acc, good, conf, probe=None):
        sig = {"confidence": conf} if probe is None else {"confidence": conf, "value_probe": probe}
        return {"measurement": {"clips": 96, "edge_accuracy": acc, "cloud_accuracy": 97.92, "edge_as_good_as_cloud": good,
                                "signals": _signals(**sig)}}

    rows = dt.gate_signal_before_after(run(84.38, 45, (0.572, 0.06, -1.39, -3.3)),
                                       run(89.41, 60, (0.687, 0.05, -0.35, -0.52), (0.75, 0.05, -0.17, -0.5)))
    assert rows[2:] == ["| mean attribute accuracy (cloud-only: 97.9 %) | 84.4 % | 89.4 % |",
                        "| clips whose edge answer is as good as cloud-only's | 45 / 96 | 60 / 96 |",
                        "| `confidence` | AUC 0.57, 20 % kept \u22121.4 | AUC 0.69, 20 % kept \u22120.3 |"]  # value_probe: v3 only


def test_gate_signal_attributes_rows():
    dt = tables_module()

    def part(acc, a, known):
        return {"attributes": {"rate": {"edge_accuracy": acc, "value_confidence_auc": a,
                                        "value_confidence_auc_if_known": known}}}

    rows = dt.gate_signal_attributes({"measurement": part(72.92, 0.647, 0.76)},
                                     {"calibration": part(67.19, 0.665, 0.946), "measurement": part(70.83, None, 0.887)})
    assert rows[2:] == ["| rate | 72.9 → 70.8 % | 0.65 → — | 0.95 / 0.89 |"]


def _calibration(met=True, gate=True):
    report = {"measure": "labels", "n_calib": 48, "n_check": 48, "choices": [],
              "settings": [{"name": "cloud-only", "mode": "cloud", "k": 4, "verify": "entropy",
                            "calibration": {"quality": 97.9, "call_rate": 0.965}, "check": {"quality": 98.3, "call_rate": 0.96}},
                           {"name": "meaning k10 u0.704", "mode": "spec", "k": 10, "verify": "meaning",
                            "gate_upload": 0.70412, "gate_verify": 0.40288,
                            "calibration": {"quality": 97.2, "call_rate": 0.08}, "check": {"quality": 98.0, "call_rate": 0.08}}],
              "gate": {"name": "frugal", "points": 3.0, "met": met, "margin": 1.0, "setting": "meaning k10 u0.704",
                       "calibration": {"quality": 97.2, "call_rate": 0.0791, "zero_cloud_share": 0.20833, "work_per_clip": 190.25},
                       "check": {"quality": 98.0, "call_rate": 0.0853, "zero_cloud_share": 0.125, "work_per_clip": 230.0},
                       "swaps": 900, "weights": 12}}
    if not gate:
        report["gate"] = None
    return report


def test_frugal_origin_reads_calibrates_report():
    dt = tables_module()
    assert dt.frugal_origin(_calibration())[2:] == [
        "| calibration half: k 10, upload 0.704, verify 0.403; within 3 points, margin z = 1 | 48 | 20.8 % | 97.2 | "
        "\u22120.7 | 0.079 | 190.2 |",
        "| check half (not chosen on) | 48 | 12.5 % | 98.0 | \u22120.3 | 0.085 | 230.0 |"]
    assert dt.frugal_origin(_calibration(met=False))[2].startswith(
        "| calibration half: none qualified (k 10, upload 0.704, verify 0.403; within 3 points, margin z = 1: the best;")
    assert dt.frugal_origin(_calibration(gate=False))[2].startswith("| no meaning gate fitted (`--no-gate`) |")
    one = _calibration()
    one["gate"]["points"] = 1.0
    assert "; within 1 point, margin z = 1 |" in dt.frugal_origin(one)[2]
    # a report from calibrate's rule (issue 41): the z it was judged at, a check half that confirmed it
    ruled = _calibration()
    ruled["gate"].update(z=2.2196, chains=[["m"]] * 12, accepted=["m"], proposed="m", confirmed=["m"])
    rows = dt.frugal_origin(ruled)[2:]
    assert "; within 3 points, margin 1 (z 2.22) |" in rows[0] and rows[1].startswith("| check half (confirmed on) |")


def test_gate_choices_rows_against_cloud_only():
    dt = tables_module()
    row = {"zero_cloud_share": 0.0, "accuracy": 97.91666, "calls_per_token": 0.96501, "bytes_up_per_clip": 133809.02,
           "cloud_work_tokens_per_clip": 322.5625}
    frugal = {"zero_cloud_share": 0.1875, "accuracy": 95.13888, "calls_per_token": 0.095760, "bytes_up_per_clip": 96193.125,
              "cloud_work_tokens_per_clip": 248.02083}
    run = {"measurement": {"cloud-only": row, "meaning-3 (k=12)": frugal}, "calibration": {"cloud-only": frugal}}
    rows = dt.gate_choices(run)
    assert rows[0].startswith("| setting (measurement set) |")
    assert rows[2:] == ["| cloud-only | 0.0 % | 97.9 % | — | 0.965 | 133,809 | 322.6 |",
                        "| meaning-3 (k=12) | 18.8 % | 95.1 % | \u22122.8 | 0.096 | 96,193 | 248.0 |"]
    assert dt.gate_choices_calibration(run)[2:] == ["| cloud-only | 18.8 % | 95.1 % | — | 0.096 | 96,193 | 248.0 |"]


def test_capacity_table_of_a_run_where_cloud_only_never_met_its_slo():
    """bench/capacity.py on a loaded machine can find no rate at which cloud-only keeps its SLO (the v3
    run of docs/results/bench-capacity-v3-v4clips.json): its × cloud-only column is then empty ("—"),
    not a crash, and the per-core column still compares server CPU per clip."""
    dt = tables_module()
    run = json.loads((ROOT / "docs/results/bench-capacity-v3-v4clips.json").read_text(encoding="utf-8"))
    assert run["modes"]["cloud"]["max_clips_per_s"] == 0.0
    rows = dt.capacity(run)
    cloud = next(r for r in rows if r.startswith("| cloud-only"))
    assert cloud.split(" | ")[2] == "—" and "4.0 (1.00)" in cloud
    quality = next(r for r in rows if r.startswith("| quality"))
    assert "9.9 (2.45)" in quality


def _only(means: dict[str, dict[str, float]]) -> dict:
    """An `evaluate_pair --only` JSON whose every attribute equals the given mean per set/channel."""
    attrs = ("gender", "rate", "pitch", "volume", "pauses", "emotion")
    return {"sets": {s: {c: {"all": {**{a: m for a in attrs}, "mean": m}} for c, m in chans.items()}
                     for s, chans in means.items()}}


def test_channel_goals_rows_and_verdicts_are_hand_computed():
    t = tables_module()
    chans = ("clean", "telephone", "codec", "room", "far field")
    before = _only({s: dict.fromkeys(chans, 0.5) for s in ("val", "val_voices", "val_synth")})
    after = _only({"val": {"clean": 0.975, "telephone": 0.95, "codec": 0.97, "room": 0.96, "far field": 0.946},
                   "val_voices": {"clean": 0.92, **dict.fromkeys(chans[1:], 0.92)},
                   "val_synth": {"clean": 0.95, "telephone": 0.90, **dict.fromkeys(chans[2:], 0.95)}})
    rows = t.channel_goals(before, after)
    assert rows[2].startswith("| training voices | 50.0 → 97.5 | 50.0 → 95.0 |") and rows[2].endswith("**met** |")
    assert "**not met** (clean 92.0 < 93)" in rows[3]  # held-out voices: the clean bar
    assert "**not met** (a channel 5.0 points below clean)" in rows[4]  # flite: telephone 5 points down
    # a pair's report.json (evaluate_pair without --only) gives the same rows from its cloud
    report = {"sets": {"val": 300}, "models": {"cloud": after, "edge": before}}
    assert t.channel_goals(before, report) == rows


def test_human_groups_counts_gender_per_speaker_group():
    t = tables_module()
    summary = {"cloud": {"mean_accuracy": 0.8, "groups": {
        "asterisk-core-sounds-en-wav (en_US_f_Allison)": {"gender": {"correct": 38, "scored": 40}},
        "kajongg": {"gender": {"correct": 9, "scored": 10}}}}}
    doc = {"label": "v5", "summary": summary, "channels": {"clean": summary, "telephone": summary}}
    rows = t.human_groups(doc)
    assert rows[0] == "| pair | channel | mode | en_US_f_Allison | kajongg | mean of all attributes |"
    assert rows[2] == "| v5 | clean | cloud | 38/40 | 9/10 | 80.0 % |" and rows[3].startswith("| v5 | telephone |")


def _mode(name: str, mean: float, rate: float, home: float) -> dict:
    return {"mode": name, "mean_accuracy": mean, "cloud_call_rate": rate, "no_cloud_share": home}


def test_eval_before_after_pairs_modes_by_name():
    t = tables_module()
    before = {"modes": [_mode("cloud", 0.859, 0.965, 0.0), _mode("frugal", 0.868, 0.112, 1 / 30)]}
    after = {"modes": [_mode("frugal", 0.897, 0.072, 13 / 60), {**_mode("quality", 0.9, 0.1, 0), "sweep": False},
                       _mode("cloud", 0.897, 0.964, 0.0)]}
    rows = t.eval_before_after(before, after)
    # quality has no "before": left out; the order is the after report's
    assert rows[2:] == ["| frugal | 86.8 → **89.7** | 0.112 → 0.072 | 3.3 → 21.7 % |",
                        "| cloud | 85.9 → **89.7** | 0.965 → 0.964 | 0.0 → 0.0 % |"]


def test_eval_by_channel_rows_per_family_with_gender():
    t = tables_module()

    def fam(mean: float, gender: float) -> dict:
        return {"mean": mean, "gender": gender, "clips": 12}

    before = {"cloud": {"telephone": fam(74.1, 75.0)}, "edge": {"telephone": fam(71.3, 75.0)}}
    after = {"cloud": {"telephone": fam(88.8, 91.7)}, "edge": {"telephone": fam(84.3, 100.0)}}
    rows = t.eval_by_channel({"v4.json": before, "v5.json": after})
    assert rows[2:] == ["| telephone (12) | 74.1 (75) → 88.8 (92) | 71.3 (75) → 84.3 (100) |"]
