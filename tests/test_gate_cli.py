"""The meaning gate above the engine (issue 26): the presets files carry it (`[gate]` table,
`verify = "meaning"`, `gate_upload` / `gate_verify`), `specdec.Pair` decodes with it, the bundled
`frugal` preset uses it, records say when a clip never reached the cloud, and the CLI takes it.

Oracles: the lossless modes (cloud-only, edge-only) run alone; the same run twice; the entropy gate
run with the same settings (the fallback must be token-identical to it); the record's own
`cloud_work_forwards` (a clip the cloud never ran); tomllib.
"""

from __future__ import annotations

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
CLIP = SAMPLES / "f_mid_mid_loud.wav"
OTHER_TASK = "请用一句中文描述说话人的情绪。"


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
    data = tomllib.loads(DEMO_PRESETS.read_text(encoding="utf-8"))
    assert load_gates(DEMO_PRESETS) == parse_gate(data["gate"])
    # The cloud folder carries the same file (a user may point --edge at either).
    assert (DEMO_DIR / "cloud" / PRESETS_FILE).read_text(encoding="utf-8") == DEMO_PRESETS.read_text(encoding="utf-8")


def test_the_pair_holds_the_fitted_gate_and_decodes_with_it(pair):
    assert pair.gate is not None and pair.gate == load_gates(DEMO_PRESETS)
    result = pair.describe(CLIP, preset="frugal")
    assert result.events and all(e.gate == "meaning" for e in result.events)
    assert all(e.limit in (0.758, 0.369) for e in result.events)
    assert result.settings["gate"] and result.settings["gate_upload"] == 0.758


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
    assert meaning.events and all(e.gate == "entropy" and e.limit == 1.23 for e in meaning.events)
    assert [e.escalated for e in meaning.events] == [e.escalated for e in entropy.events]


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
