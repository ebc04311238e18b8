"""`specdec eval` without labels (issue 29): it reports what it can, through a real process:
agreement with cloud-only's sentence (as `specdec calibrate` scores without labels), cloud work,
the share of clips the cloud never touched, speed; and says in one line that accuracy needs
--labels. The oracle for agreement: the same clips described by separate `specdec describe` runs
in each mode, compared attribute by attribute here."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import FAST, run_specdec

from specdec_cli.phrases import ATTRIBUTES

pytestmark = pytest.mark.spawns
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CLIPS = ("f_fast_high.wav", "m_slow_low.wav")


def specdec(*args: str, **kw) -> subprocess.CompletedProcess:
    return run_specdec("--threads", "1", *args, **kw)


def stated(text: str) -> dict[str, str]:
    """The attributes a sentence states by exactly one canonical phrase."""
    out = {}
    for attr, phrases in ATTRIBUTES.items():
        found = [p for p in phrases if p in text]
        if len(found) == 1:
            out[attr] = found[0]
    return out


def test_eval_without_labels_reports_agreement_cost_and_speed(tmp_path):
    folder = tmp_path / "clips"
    folder.mkdir()
    for name in CLIPS:
        shutil.copy(SAMPLES / name, folder / name)
    done = specdec("eval", str(folder), "--modes", "edge,cloud", "--json", *FAST, timeout=300)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("no labels")]
    assert notes == [f"no labels ({folder / 'labels.jsonl'} not found): accuracy needs --labels; quality is "
                     "agreement with cloud-only's sentence"]
    report = json.loads(done.stdout)
    assert report["labels"] is None and report["clips"] == 2
    rows = {row["mode"]: row for row in report["modes"]}
    assert rows["cloud"]["agreement"] == 1.0 and rows["cloud"]["mean_accuracy"] is None
    assert rows["edge"]["no_cloud_share"] == 1.0 and rows["cloud"]["no_cloud_share"] == 0.0
    assert rows["edge"]["cloud_work_tokens"] == 0 and rows["cloud"]["cloud_work_tokens"] > 0
    assert all(row["latency_s"]["mean"] > 0 for row in rows.values())

    # The oracle: each mode's sentences from separate describe runs, compared attribute by attribute.
    files = [str(folder / name) for name in CLIPS]
    texts = {}
    for mode in ("edge", "cloud"):
        described = specdec("describe", *files, "--mode", mode, "--json", *FAST)
        texts[mode] = {Path(json.loads(line)["file"]).name: json.loads(line)["description"]
                       for line in described.stdout.splitlines()}
    per_clip = []
    for name in CLIPS:
        reference = stated(texts["cloud"][name])
        assert reference, texts["cloud"][name]  # the demo pair states its attributes by phrases
        edge = stated(texts["edge"][name])
        per_clip.append(sum(edge.get(a) == v for a, v in reference.items()) / len(reference))
    records = {(r["eval_mode"], r["file"]): r for r in report["records"]}
    assert [records[("edge", name)]["description"] for name in CLIPS] == [texts["edge"][n] for n in CLIPS]
    assert [records[("edge", name)]["agreement"] for name in CLIPS] == pytest.approx(per_clip)
    assert rows["edge"]["agreement"] == pytest.approx(sum(per_clip) / len(per_clip))

    # The tables on stdout (without --json): agreement where accuracy would be.
    tables = specdec("eval", str(folder), "--modes", "edge,cloud", *FAST, timeout=300)
    assert tables.returncode == 0, tables.stderr
    assert "agreement" in tables.stdout and "accuracy" not in tables.stdout and "no cloud" in tables.stdout
    cloud_row = next(line for line in tables.stdout.splitlines() if line.split()[:1] == ["cloud"])
    assert cloud_row.split()[1] == "100.0%"


def test_eval_without_labels_or_the_cloud_mode_says_what_agreement_needs(tmp_path):
    folder = tmp_path / "clips"
    folder.mkdir()
    shutil.copy(SAMPLES / CLIPS[0], folder / CLIPS[0])
    done = specdec("eval", str(folder), "--modes", "edge", *FAST, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (f"no labels ({folder / 'labels.jsonl'} not found): accuracy needs --labels; add cloud to --modes for "
            "agreement with cloud-only's sentence") in done.stderr.splitlines()
    refused = specdec("eval", str(folder), "--labels", str(folder / "labels.jsonl"))
    assert refused.returncode == 2 and "labels file not found" in refused.stderr  # asked for: still required
