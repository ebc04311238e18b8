"""Ray Data's route (issue 53): the guide's `caption_with_ray` example, run as written on a local Ray
with two actors (read_parquet -> map_batches over the actor pool -> write_parquet), must write the
rows the single-process `specdec batch` writes for the same Parquet file: every column but the
timings, in the input's order, a bad row's error included.

The Ray is the module's own (tests/ray_fixtures.py: loopback, a small object store, every process
it started checked gone at the end), which `caption_with_ray` keeps as a process that already
called ray.init does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import ray_fixtures
from test_corpus import BAD, CLIPS, TIMING, dataset, invoke

from specdec_cli.errors import InputError

datasets = pytest.importorskip("datasets")
pytest.importorskip("ray.data")
pq = pytest.importorskip("pyarrow.parquet")

local_ray = ray_fixtures.local_ray  # one local Ray for the module
ROOT = Path(__file__).resolve().parents[1]


def ray_example() -> str:
    text = (ROOT / "docs" / "corpus.md").read_text(encoding="utf-8")
    section = text.split("\n## Past one machine: Ray Data\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "the guide's Ray Data section lost its example"
    return code.group(1)


def test_ray_data_writes_the_rows_the_single_process_run_writes(local_ray, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dataset(bad=True).to_parquet("corpus.parquet")
    single = invoke("batch", "corpus.parquet", "--out", "captions.parquet")
    assert single.exit_code == 1, single.output  # the bad row
    expected = pq.read_table("captions.parquet")

    exec(compile(ray_example(), "docs/corpus.md (Ray Data)", "exec"), {"__name__": "ray_example"})

    got = pq.read_table("captions-ray")
    columns = [c for c in expected.column_names if c not in TIMING]
    assert got.column_names == expected.column_names
    assert got.select(columns).to_pylist() == expected.select(columns).to_pylist()
    assert [r["file"] for r in got.select(["file"]).to_pylist()] == [c.name for c in CLIPS] + ["bad.wav"]
    assert got.column("audio")[3]["bytes"].as_py() == BAD
    assert isinstance(datasets.Features.from_arrow_schema(got.schema)["audio"], datasets.Audio)

    with pytest.raises(InputError, match="captions-ray exists; give another destination, or overwrite=True"):
        exec(compile(ray_example(), "docs/corpus.md (Ray Data)", "exec"), {"__name__": "ray_example"})


def test_the_actor_pool_leaves_a_cpu_slot_for_reads_and_writes():
    """A pool holding every CPU slot hangs Ray Data (ray-project/ray#44687: the test above waited
    in write_parquet with both actors idle, on its 2-CPU Ray with workers=2)."""
    from specdec_cli.scale.ray_data import actor_cpus

    assert actor_cpus(2, 2) == 0.5 and actor_cpus(1, 1) == 0.0  # the rest shared, one slot left
    assert actor_cpus(8, 2) == 1.0 and actor_cpus(3, 2) == 1.0  # room: a CPU each
    assert actor_cpus(0, 4) == 1.0  # a cluster stating no CPUs: Ray's default
    for cpus in (1, 2, 3, 4, 16):
        for workers in range(1, cpus + 1):
            assert workers * actor_cpus(cpus, workers) <= cpus - 1
