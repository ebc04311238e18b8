"""`specdec batch` over datasets (issue 53): a Parquet file with the audio's bytes in its rows, a
`save_to_disk` folder of splits, an audiofolder with metadata.csv, each built here with `datasets`
and `pyarrow` themselves. The oracle is the folder-of-WAV -> JSON Lines batch over the same clips:
every row's record must equal that clip's record (but for the timings and the file's name), and the
input's columns must come back as they went in.

Resuming on the JSON Lines terms: a batch SIGKILLed after its first journaled row loses nothing and
describes nothing twice; a rerun goes on; other settings, another input, and an output specdec did
not write are refused untouched; --overwrite keeps the old one. And the columns follow the record's
fields, whatever they are.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import subprocess_env
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.results import read_records

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
# The three shortest samples: every run here decodes each once or twice.
CLIPS = sorted(SAMPLES.glob("*.wav"), key=lambda p: p.stat().st_size)[:3]
TIMING = {"latency_s", "tokens_per_s"}
BAD = b"RIFF but not really a wav file at all"


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING and k != "file"}


def invoke(*args: str):
    return CliRunner().invoke(app, [*map(str, args)])


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> dict[str, dict]:
    """The folder-of-WAV -> JSON Lines batch over CLIPS: records by clip name."""
    folder = tmp_path_factory.mktemp("wavs")
    for clip in CLIPS:
        shutil.copy(clip, folder / clip.name)
    out = folder.parent / "oracle.jsonl"
    result = invoke("batch", folder, "--out", out)
    assert result.exit_code == 0, result.output
    records = {Path(r["file"]).name: r for r in read_records(out)}
    assert sorted(records) == sorted(c.name for c in CLIPS)
    assert all(r["error"] is None and r["description"] for r in records.values())
    return records


def dataset(bad: bool = False):
    """CLIPS as a Dataset: the Audio column holds each file's bytes (and its name), beside two
    columns of our own; `bad`: a last row whose bytes are not audio."""
    audio = [{"bytes": c.read_bytes(), "path": c.name} for c in CLIPS]
    if bad:
        audio.append({"bytes": BAD, "path": "bad.wav"})
    rows = {"audio": audio, "speaker": [a["path"][0] for a in audio], "id": list(range(len(audio)))}
    return datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio())


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def check_rows(rows: list[dict], oracle: dict[str, dict], names: list[str]) -> None:
    """Each row's record columns equal that clip's JSON Lines record; its file is the Audio path."""
    fields = [k for k in next(iter(oracle.values())) if k not in TIMING]
    assert [row["file"] for row in rows] == names
    for row in rows:
        name = Path(row["file"]).name
        assert comparable({k: row[k] for k in fields}) == comparable(oracle[name]), name


@pytest.fixture(scope="module")
def parquet_run(tmp_path_factory):
    """CLIPS and a bad row in a Parquet file (the bytes in the rows), through `specdec batch` once:
    (the input, the output, what the command printed)."""
    folder = tmp_path_factory.mktemp("parquet")
    source, out = folder / "corpus.parquet", folder / "captions.parquet"
    dataset(bad=True).to_parquet(str(source))
    result = invoke("batch", source, "--out", out)
    return source, out, result


def test_parquet_in_parquet_out_equals_the_folder_batch(oracle, parquet_run):
    source, out, result = parquet_run
    tmp_path = out.parent
    table = pq.read_table(source)
    assert table.column("audio")[0]["bytes"].as_py() == CLIPS[0].read_bytes()  # the bytes are in the rows
    assert result.exit_code == 1, result.output  # the bad row failed; every other row was described
    assert "3 ok · 1 failed · 0 skipped" in result.output
    assert "failed: row 3 (bad.wav): cannot decode bad.wav as audio" in result.output
    assert "batch: 4/4 rows (1 failed), " in result.output and " rows/s, " in result.output  # off a terminal
    assert "1 of 4 rows failed; their error column in" in result.output
    rows = rows_of(out)
    check_rows(rows[:3], oracle, [c.name for c in CLIPS])
    bad = rows[3]
    assert bad["error"].startswith("cannot decode bad.wav as audio") and bad["description"] is None
    assert bad["error_kind"] == "input" and bad["settings"] == rows[0]["settings"]
    # Every input column comes back as it went in, the audio's bytes included, in the input's order.
    got = pq.read_table(out)
    assert got.select(table.column_names).equals(table.select(table.column_names))
    # and datasets reads the audio column back as Audio, the record's columns as values.
    features = datasets.Features.from_arrow_schema(got.schema)
    assert isinstance(features["audio"], datasets.Audio) and features["tokens"] == datasets.Value("int64")
    assert not list(tmp_path.glob(".captions.parquet*.jsonl"))  # the journal goes once the output holds it all

    again = invoke("batch", source, "--out", out)  # the failed row is retried, the others are kept
    assert again.exit_code == 1, again.output
    assert "0 ok · 1 failed · 3 skipped (already recorded)" in again.output
    rows2 = rows_of(out)
    assert [r["latency_s"] for r in rows2[:3]] == [r["latency_s"] for r in rows[:3]]  # not described again

    other = invoke("batch", source, "--out", out, "--mode", "cloud")
    assert other.exit_code == 2
    assert "was made with other settings (made with mode spec" in other.output
    assert rows_of(out) == rows2  # untouched


def test_the_ray_data_actor_on_blocks_without_metadata_writes_the_clis_rows(parquet_run):
    """What each Ray Data actor runs (scale/ray_data.PoolActor holding a Captioner) on Arrow blocks as
    read_parquet hands them over (here: row batches of the file, their schema metadata dropped), against
    the single-process command's output: every column but the timings, the Audio feature kept.
    (tests/test_corpus_ray.py runs the whole pipeline on a local Ray.)"""
    from specdec_cli.corpus import Captioner
    from specdec_cli.scale.ray_data import PoolActor

    source, out, _ = parquet_run
    actor = PoolActor(Captioner(threads=1))
    blocks = [pa.Table.from_batches([b]).replace_schema_metadata(None)
              for b in pq.ParquetFile(source).iter_batches(batch_size=2)]
    got = pa.concat_tables([actor(block) for block in blocks])
    expected = pq.read_table(out)
    columns = [c for c in expected.column_names if c not in TIMING]
    assert got.column_names == expected.column_names
    assert got.select(columns).to_pylist() == expected.select(columns).to_pylist()
    assert isinstance(datasets.Features.from_arrow_schema(got.schema)["audio"], datasets.Audio)


def test_a_saved_dataset_dict_split_to_a_folder_and_overwrite(oracle, tmp_path):
    source = tmp_path / "saved"
    good = dataset()
    datasets.DatasetDict(train=good, test=good.select([0, 1])).save_to_disk(str(source))
    out = tmp_path / "captions"

    refused = invoke("batch", source, "--out", f"{out}/")
    assert refused.exit_code == 2
    assert refused.output.strip() == f"error: {source} holds 2 splits (train, test); choose one with --split"

    result = invoke("batch", source, "--out", f"{out}/", "--split", "test")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet"]  # no journal left behind
    check_rows(rows_of(out / "part-00000.parquet"), oracle, [c.name for c in CLIPS[:2]])

    other_input = invoke("batch", source, "--out", f"{out}/", "--split", "train")
    assert other_input.exit_code == 2
    assert "was made from another input (" in other_input.output and "split test, 2 rows" in other_input.output

    over = invoke("batch", source, "--out", f"{out}/", "--split", "train", "--overwrite")
    assert over.exit_code == 0, over.output
    assert f"starting over; the old output is kept in {out}.bak" in over.output
    check_rows(rows_of(out / "part-00000.parquet"), oracle, [c.name for c in CLIPS])
    assert pq.read_table(Path(f"{out}.bak") / "part-00000.parquet").num_rows == 2


def test_an_audiofolder_with_metadata(oracle, tmp_path):
    source = tmp_path / "folder"
    source.mkdir()
    for clip in CLIPS[:2]:
        shutil.copy(clip, source / clip.name)
    (source / "metadata.csv").write_text("file_name,speaker,text\n" + "".join(
        f"{c.name},s{i},line {i}\n" for i, c in enumerate(CLIPS[:2])), encoding="utf-8")
    out = tmp_path / "captions.parquet"
    result = invoke("batch", source, "--out", out)
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    check_rows(rows, oracle, [str(source / c.name) for c in CLIPS[:2]])  # an audiofolder's paths are the files'
    assert [(r["speaker"], r["text"]) for r in rows] == [("s0", "line 0"), ("s1", "line 1")]
    assert [r["audio"] for r in rows] == [{"bytes": None, "path": str(source / c.name)} for c in CLIPS[:2]]


# The real `specdec batch` in its own process, gated after each journaled row (as test_batch.py
# gates the JSON Lines writer): the test lets it journal exactly one row, then SIGKILLs it.
GATED = """
import os
import specdec_cli.corpus as corpus
gate = int(os.environ["SPECDEC_TEST_GATE_FD"])
append = corpus.CorpusResults.append
def gated(self, row, record):
    append(self, row, record)
    if not os.read(gate, 1):
        os._exit(3)
corpus.CorpusResults.append = gated
from specdec_cli.commands.app import main
main()
"""


def journal_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]


def test_a_killed_run_loses_nothing_and_describes_nothing_twice(oracle, tmp_path):
    source = tmp_path / "corpus.parquet"
    dataset().to_parquet(str(source))
    out = tmp_path / "captions.parquet"
    journal = tmp_path / ".captions.parquet.specdec.jsonl"
    args = ["batch", str(source), "--out", str(out), "--batch-size", "1"]
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", GATED, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(subprocess_env(), SPECDEC_TEST_GATE_FD=str(read_end)), pass_fds=(read_end,))
    os.close(read_end)
    try:
        deadline = time.monotonic() + 600  # a guard against a hung child, not a pace
        while proc.poll() is None and not journal_rows(journal) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGKILL)  # blocked at the gate, its first row on disk
        proc.wait(timeout=60)
    finally:
        os.close(write_end)
    first = journal_rows(journal)
    assert len(first) == 1 and not out.exists()
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "2 ok · 0 failed · 1 skipped (already recorded)" in result.output
    rows = rows_of(out)
    check_rows(rows, oracle, [c.name for c in CLIPS])
    kept = rows[first[0]["row"]]
    assert kept["latency_s"] == first[0]["record"]["latency_s"]  # the journaled row was kept, not redone
    assert not journal.exists()


def test_outputs_specdec_did_not_write_are_refused_untouched(tmp_path):
    source = tmp_path / "corpus.parquet"
    dataset().to_parquet(str(source))
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), foreign)
    before = foreign.read_bytes()
    result = invoke("batch", source, "--out", foreign)
    assert result.exit_code == 2
    assert "foreign.parquet is a Parquet file specdec did not write (its metadata has no specdec stamp)" in result.output
    assert foreign.read_bytes() == before
    notes = tmp_path / "notes.parquet"
    notes.write_text("my notes\n")
    result = invoke("batch", source, "--out", notes)
    assert result.exit_code == 2 and "notes.parquet is not a Parquet file" in result.output
    assert notes.read_text() == "my notes\n"
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "README.txt").write_text("mine")
    result = invoke("batch", source, "--out", folder)
    assert result.exit_code == 2 and "holds files specdec did not write (README.txt)" in result.output


@pytest.mark.parametrize("args, message", [
    (["--out", "r.jsonl"], "corpus.parquet is a dataset: its rows are written with their columns to Parquet, not "
                           "to r.jsonl; give --out NAME.parquet, or a folder (NAME/)"),
    (["--out", "c.parquet", "--audio-column", "id"], "column 'id' of corpus.parquet holds int64, not audio"),
    (["--out", "c.parquet", "--audio-column", "nope"], "has no column 'nope' (its columns: audio, speaker, id)"),
    (["--out", "c.parquet", "--split", "test"], "corpus.parquet holds no splits; leave out --split"),
    (["--out", "c.parquet", "--segment"], "--segment takes a folder of recordings"),
    (["--out", "c.parquet", "--ray", "auto"], "a Parquet dataset goes past one machine with Ray Data"),
])
def test_dataset_options_are_checked_before_any_model_loads(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    dataset().to_parquet("corpus.parquet")
    result = invoke("batch", "corpus.parquet", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not Path("c.parquet").exists() and not Path("r.jsonl").exists()


def test_parquet_without_features_is_read_by_the_audio_structs_shape(tmp_path):
    from specdec_cli.corpus import open_corpus

    dataset().to_parquet(str(tmp_path / "hf.parquet"))
    plain = tmp_path / "plain.parquet"
    pq.write_table(pq.read_table(tmp_path / "hf.parquet").replace_schema_metadata(None), plain)
    corpus = open_corpus(plain)
    assert (corpus.audio_column, corpus.num_rows, corpus.split) == ("audio", 3, None)
    cells = [cell for table in corpus.batches(2) for cell in table.column("audio").to_pylist()]
    assert [c["bytes"] for c in cells] == [c.read_bytes() for c in CLIPS]


def test_a_folder_of_audio_keeps_its_json_lines_route_and_refuses_dataset_options(tmp_path):
    result = invoke("batch", SAMPLES, "--out", tmp_path / "r.jsonl", "--split", "train")
    assert result.exit_code == 2
    assert "--audio-column, --split and --column-prefix are for a dataset" in result.output


def test_the_columns_follow_the_records_fields(monkeypatch):
    """A field someone adds to the records (here `band_limited`, as another issue will) becomes a
    column with its type, with no change to the corpus code; a column the input has already is
    refused unless the record's columns get a prefix."""
    import specdec_cli.corpus as corpus
    import specdec_cli.pair as pair_module
    import specdec_cli.records as records

    original = records.clip_record

    def with_band(*args, **kwargs):
        record = original(*args, **kwargs)
        record["band_limited"] = record["audio_s"] > 4.0
        return record

    monkeypatch.setattr(records, "clip_record", with_band)
    monkeypatch.setattr(pair_module, "clip_record", with_band)
    monkeypatch.setattr(corpus, "_LOADED", {})
    loads = []
    from_spec = pair_module.Pair.from_spec.__func__
    monkeypatch.setattr(pair_module.Pair, "from_spec",
                        classmethod(lambda cls, spec: loads.append(spec) or from_spec(cls, spec)))
    batch = dataset(bad=True).with_format("arrow")[:]
    captioner = corpus.Captioner(threads=1)
    out = captioner(batch)
    assert "band_limited" in captioner.columns and out.schema.field("band_limited").type == pa.bool_()
    assert out.column("band_limited").to_pylist() == [r["audio_s"] > 4.0 if r["audio_s"] else None
                                                      for r in out.select(["audio_s"]).to_pylist()]
    assert out.column("error").to_pylist()[:3] == [None] * 3 and out.column("error")[3].as_py().startswith("cannot")

    clash = batch.append_column("description", pa.array(["old"] * batch.num_rows))
    with pytest.raises(Exception, match="already has column description.*--column-prefix"):
        captioner(clash)
    assert captioner(batch.slice(0, 1)).column("description")[0] == out.column("description")[0]
    assert len(loads) == 1  # one pair for every batch this process is given
    prefixed = corpus.Captioner(threads=1, prefix="specdec_")(clash)
    assert prefixed.column("description").to_pylist() == ["old"] * 4
    assert prefixed.column("specdec_description").to_pylist()[:3] == out.column("description").to_pylist()[:3]
