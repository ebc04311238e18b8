"""The meaning gate above the engine (issue 26): the presets files carry it (`[gate]` table,
`verify = "meaning"`, `gate_upload` / `gate_verify`), `specdec.Pair` decodes with it, the bundled
`frugal` preset uses it, records say when a clip never reached the cloud, and the CLI takes it.

Oracles: the lossless modes (cloud-only, edge-only) run alone; the same run twice; the entropy gate
run with the same settings (the fallback must be token-identical to it); the record's own
`cloud_work_forwards` (a clip the cloud never ran); tomllib.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from cli_helpers import run_specdec

from specdec import Pair
from specdec_cli.errors import InputError
from specdec_cli.gate_presets import load_gates, parse_gate
from specdec_cli.models import DEMO_DIR, PRESETS_FILE
from specdec_cli.presets import load_presets

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
DEMO_PRESETS = DEMO_DIR / "edge" / PRESETS_FILE
CLIP = SAMPLES / "f_mid_low_noisy.wav"  # frugal sends it up (v5 pair: 3 verifications; f_mid_mid_loud.wav stays home now)
OTHER_TASK = "请用一句中文描述说话人的情绪。"
# The bundled presets as written (tomllib): what the decoded events, traces and modes must carry.
BUNDLED = tomllib.loads(DEMO_PRESETS.read_text(encoding="utf-8"))
FRUGAL, QUALITY = BUNDLED["frugal"], BUNDLED["quality"]


@pytest.fixture(scope="module")
def pair() -> Pair:
    return Pair()


def test_the_bundled_presets_hold_frugal_on_the_meaning_gate():
    presets = load_presets(DEMO_PRESETS)
    assert "gate" not in presets  # the [gate] table is not a preset
    frugal = presets["frugal"].values
    assert frugal["verify"] == "meaning" and {"gate_upload", "gate_verify", "threshold"} <= set(frugal)
    for name in ("fluent", "quality"):  # unchanged: the entropy gate
        assert presets[name].values["verify"] == "entropy"
    assert frugal["threshold"] == presets["fluent"].values["threshold"]  # its fallback is fluent's (calibrate)
    data = tomllib.loads(DEMO_PRESETS.read_text(encoding="utf-8"))
    assert load_gates(DEMO_PRESETS) == parse_gate(data["gate"])
    # The cloud folder carries the same file (a user may point --edge at either).
    assert (DEMO_DIR / "cloud" / PRESETS_FILE).read_text(encoding="utf-8") == DEMO_PRESETS.read_text(encoding="utf-8")


def test_the_pair_holds_the_fitted_gate_and_decodes_with_it(pair):
    assert pair.gate is not None and pair.gate == load_gates(DEMO_PRESETS)
    result = pair.describe(CLIP, preset="frugal")
    assert result.events and all(e.gate == "meaning" for e in result.events)
    assert all(e.limit in (FRUGAL["gate_upload"], FRUGAL["gate_verify"]) for e in result.events)
    assert result.settings["gate"] and result.settings["gate_upload"] == FRUGAL["gate_upload"]


def test_lossless_modes_hold_through_the_preset(pair):
    cloud_only = pair.describe(CLIP, mode="cloud").token_ids
    edge_only = pair.describe(CLIP, mode="edge").token_ids
    assert pair.describe(CLIP, preset="frugal", verify="always").token_ids == cloud_only
    assert pair.describe(CLIP, preset="frugal", threshold=float("inf")).token_ids == edge_only
    never = pair.describe(CLIP, preset="frugal", gate_upload=float("inf"), gate_verify=float("inf"))
    assert never.token_ids == edge_only


def test_a_greedy_run_on_the_meaning_gate_is_deterministic(pair):
    first, second = (pair.describe(CLIP, preset="frugal") for _ in range(2))
    assert first.token_ids == second.token_ids
    assert [(e.score, e.escalated, e.accepted) for e in first.events] == \
        [(e.score, e.escalated, e.accepted) for e in second.events]


def test_records_say_whether_the_clip_reached_the_cloud(pair):
    stays = pair.describe(CLIP, preset="frugal", gate_upload=float("inf"), gate_verify=float("inf"))
    goes = pair.describe(CLIP, preset="frugal", gate_upload=0.0)
    assert stays.cloud_work_forwards == 0 and stays.cloud_free is True
    assert goes.cloud_work_forwards > 0 and goes.cloud_free is False
    assert pair.describe(CLIP, mode="cloud").cloud_free is False
    assert pair.describe(CLIP, mode="edge").cloud_free is True


def test_another_instruction_falls_back_to_the_entropy_gate(pair):
    meaning = pair.describe(CLIP, preset="frugal", instruction=OTHER_TASK)
    entropy = pair.describe(CLIP, preset="frugal", verify="entropy", instruction=OTHER_TASK)
    assert meaning.token_ids == entropy.token_ids
    assert meaning.events and all(e.gate == "entropy" and e.limit == FRUGAL["threshold"] for e in meaning.events)
    assert [e.escalated for e in meaning.events] == [e.escalated for e in entropy.events]
    assert meaning.settings["gate"] is None  # the record names no gate: none decided
    assert pair.describe(CLIP, preset="frugal").settings["gate"] is not None  # the gate's own task


def test_a_gate_fitted_on_another_tokenizer_is_not_used(tmp_path):
    text = DEMO_PRESETS.read_text(encoding="utf-8").replace('tokenizer = "4badc84379d60f68"',
                                                            'tokenizer = "0123456789abcdef"')
    other = tmp_path / "presets.toml"
    other.write_text(text, encoding="utf-8")
    pair = Pair(presets=other)
    assert pair.gate is None  # the last file holding a [gate] table wins, and it does not fit
    meaning = pair.describe(CLIP, preset="frugal")
    entropy = pair.describe(CLIP, preset="frugal", verify="entropy")
    assert meaning.token_ids == entropy.token_ids
    assert all(e.gate == "entropy" for e in meaning.events)
    assert meaning.settings["gate"] is None  # the record says no gate decided


@pytest.mark.parametrize("table, key", [
    ('[frugal]\nverify = "meaning"\ngate_uplaod = 0.5\n', "'gate_uplaod' in [frugal]; did you mean 'gate_upload'?"),
    ('[gate]\nids = [1]\nweights = [0.5]\ndefualt = 1.0\n', "'defualt' in [gate]; did you mean 'default'?"),
])
def test_a_misspelled_gate_key_is_refused_in_one_line(tmp_path, table, key):
    bad = tmp_path / "bad.toml"
    bad.write_text(table, encoding="utf-8")
    with pytest.raises(InputError) as err:
        Pair(presets=bad)
    assert key in str(err.value) and "\n" not in str(err.value)
    done = run_specdec("presets", "--presets", str(bad))
    assert done.returncode == 2 and key in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# -- the command line -------------------------------------------------------------------------------

def _help(command: str) -> str:
    done = run_specdec(command, "--help")
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.replace("│", " ").split())


def test_the_gate_options_are_declared_once_with_the_same_help():
    from specdec_cli.commands.options import DECODING, EVAL_GENERATION, GATE_PARAMS

    for group in (DECODING, EVAL_GENERATION):
        for name, param in GATE_PARAMS.items():
            assert group.params[name] is param
    for command in ("describe", "batch", "eval"):
        text = _help(command)
        assert "--gate-upload" in text and "--gate-verify" in text, command
    assert "meaning" in _help("describe")


def test_describe_with_the_meaning_gate_from_the_command_line(tmp_path):
    args = ("describe", str(CLIP), "--preset", "frugal", "--json")
    first, second = run_specdec(*args), run_specdec(*args)
    assert first.returncode == 0, first.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["description"] == b["description"] and a["verify"] == "meaning"
    assert a["cloud_free"] is (a["cloud_work_forwards"] == 0)
    stays = json.loads(run_specdec("describe", str(CLIP), "--verify", "meaning", "--gate-upload", "inf",
                                   "--gate-verify", "inf", "--json").stdout)
    assert stays["cloud_free"] is True and stays["cloud_work_forwards"] == 0
    assert stays["settings"]["gate_upload"] == "inf" and stays["settings"]["gate"]


def test_the_trace_and_the_plot_show_the_meaning_score_against_its_limit(pair, tmp_path):
    from specdec_cli.commands.ui import trace_lines

    result = pair.describe(CLIP, preset="frugal")
    cfg = pair.settings("frugal")
    lines = [line.plain for line in trace_lines(result.events, pair.tokenizer, cfg)]
    assert f"Σm > {FRUGAL['gate_upload']:g}" in lines[0] and f"{FRUGAL['gate_verify']:g}" in lines[0]
    for e, line in zip(result.events, lines[1:], strict=True):
        assert f"Σm {e.score:.2f} {'>' if e.score > e.limit else '≤'} {e.limit:g}" in line
        assert ("→ cloud (meaning)" in line) is (e.escalated and e.reason == "meaning")
        assert f"/{e.meaning[0]:.2f}" in line
    # The entropy gate's trace reads as before.
    entropy = pair.describe(CLIP, preset="quality")
    first = trace_lines(entropy.events, pair.tokenizer, pair.settings("quality"))[0].plain
    assert first.startswith(f"trace · escalate when ΣH > {QUALITY['threshold']:g} · k {QUALITY['k']} · verify entropy")
    pytest.importorskip("matplotlib")
    from specdec_cli.commands.plots import plot_trace

    assert plot_trace(result.events, cfg.threshold, tmp_path / "trace.png", pair.tokenizer).stat().st_size > 0


def test_eval_runs_any_preset_by_name_and_batch_counts_the_clips_that_stayed(tmp_path):
    from specdec_cli import evaluate

    presets = load_presets(DEMO_PRESETS)
    assert evaluate.parse_modes("cloud,frugal", presets) == ["cloud", "frugal"]
    with pytest.raises(InputError, match="frugal"):
        evaluate.parse_modes("frugl", presets)
    [mode] = evaluate.mode_configs(["frugal"], DEMO_PRESETS, 64, settings={"gate_verify": 0.5})
    assert mode.cfg.verify == "meaning" and mode.cfg.gate_upload == FRUGAL["gate_upload"] and mode.cfg.gate_verify == 0.5
    clips = tmp_path / "clips"
    clips.mkdir()
    for name in ("f_mid_mid_loud.wav", "m_slow_low.wav"):
        (clips / name).write_bytes((SAMPLES / name).read_bytes())
    done = run_specdec("batch", str(clips), "--out", str(tmp_path / "r.jsonl"), "--verify", "meaning",
                       "--gate-upload", "inf", "--gate-verify", "inf")
    assert done.returncode == 0, done.stderr
    assert "cloud-free: 2 of 2 clips (100%) never reached the cloud" in done.stderr


def test_the_gate_runs_on_the_edge_with_a_remote_cloud(pair):
    from remote_helpers import Server

    local = pair.describe(CLIP, preset="frugal")
    local_free = pair.describe(CLIP, preset="frugal", gate_upload=float("inf"), gate_verify=float("inf"))
    with Server() as server:
        remote = Pair(cloud=server.url)
        assert remote.gate == pair.gate
        far = remote.describe(CLIP, preset="frugal")
        far_free = remote.describe(CLIP, preset="frugal", gate_upload=float("inf"), gate_verify=float("inf"))
    assert far.token_ids == local.token_ids
    assert [(e.score, e.escalated) for e in far.events] == [(e.score, e.escalated) for e in local.events]
    assert far.cloud_free is False and far.uplink_bytes > 0
    # A clip that stays on the edge sends nothing at all.
    assert far_free.token_ids == local_free.token_ids
    assert far_free.cloud_free is True and far_free.uplink_bytes == 0 and far_free.round_trips == 0


def test_the_live_view_and_the_summary_name_the_meaning_gate(pair):
    from rich.console import Console

    from specdec_cli.commands.ui import LiveView, summary_panel

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    view = LiveView(console, pair.tokenizer, pair.settings("frugal"), enabled=False)
    result = pair.describe(CLIP, preset="frugal", on_block=view.on_block)
    last = result.events[-1]
    # the cloud's own token beside the meaning scores: the meaning row has no cell for it (that
    # column stays empty; the short row made the view raise IndexError on the v5 pair)
    assert last.correction is not None and last.meaning is not None and len(last.meaning) == len(last.draft)
    console.print(view.render())
    shown = console.export_text()
    assert f"Σm {last.score:.2f}" in shown and "meaning" in shown and f"Σm > {FRUGAL['gate_upload']:g} / {FRUGAL['gate_verify']:g} (up / held)" in shown
    stays = pair.describe(CLIP, preset="frugal", gate_upload=float("inf"), gate_verify=float("inf"))
    console.print(summary_panel(stays.record))
    panel = console.export_text()
    assert "never reached" in panel and "upload inf · verify inf" in panel


def test_batched_rows_decode_with_the_gate_as_one_clip_at_a_time(pair):
    clips = [SAMPLES / n for n in ("f_mid_mid_loud.wav", "m_slow_low.wav", "f_fast_high.wav")]
    alone = {str(c): (r.token_ids, r.cloud_calls) for c in clips if (r := pair.describe(c, preset="frugal"))}
    rows = {str(path): result for path, result in pair.describe_many(clips, batch_size=3, preset="frugal")}
    assert {k: (r.token_ids, r.cloud_calls) for k, r in rows.items()} == alone  # the entropy gate differs here
    assert all(r.cloud_free is (r.cloud_work_forwards == 0) for r in rows.values())
