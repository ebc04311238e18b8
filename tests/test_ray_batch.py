"""`specdec batch --ray` on a local Ray with two workers: the same records as the single-process
batch on the bundled samples (the oracle), and a worker SIGKILLed mid-run loses and doubles nothing.

One Ray is started for the module (start-up takes seconds) and shut down at its end; the teardown
checks that every process it started is gone. `--ray auto` runs inside the module reuse it, as a
process that already called ray.init does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
from functools import partial
from pathlib import Path

import pytest
import ray_fixtures
from typer.testing import CliRunner

from specdec_cli.audio import load_audio
from specdec_cli.commands.app import app
from specdec_cli.errors import InputError, ModelError, SpecdecError
from specdec_cli.pair import BatchWorker
from specdec_cli.results import ResultsFile, read_records, run_batch
from specdec_cli.scale import ray_batch
from specdec_cli.scale.ray_batch import INSTALL_HINT, RayOptions, WorkerEvent
from specdec_cli.settings import PairSpec

ray = pytest.importorskip("ray")  # in the dev extra; the skip only spares a bare install

local_ray = ray_fixtures.local_ray  # one local Ray for the module (tests/ray_fixtures.py)
alive = ray_fixtures.alive
SAMPLES = Path(__file__).resolve().parent.parent / "samples"
# What two runs of one clip may differ in: wall time, and the rate computed from it (and the path,
# when the clip was copied; records are compared by file name).
TIMING = {"latency_s", "tokens_per_s"}


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING and k != "file"}


def by_name(path: Path) -> dict[str, dict]:
    """The records of a results file by clip file name; a clip recorded twice fails here."""
    records = read_records(path)
    names = [Path(r["file"]).name for r in records]
    assert len(names) == len(set(names)), f"a clip recorded twice: {sorted(names)}"
    return {Path(r["file"]).name: r for r in records}


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, dict]:
    """The oracle: the single-process batch on the bundled samples (bundled demo pair, default preset)."""
    out = tmp_path_factory.mktemp("single") / "r.jsonl"
    result = CliRunner().invoke(app, ["batch", str(SAMPLES), "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = by_name(out)
    assert len(records) == len(list(SAMPLES.glob("*.wav"))) >= 9
    assert all(r["error"] is None and r["description"] for r in records.values())
    return records


def test_ray_batch_matches_single_process(local_ray, single, tmp_path):
    """The CLI as a user runs it (--ray auto: the workers read the clips themselves, rows in flight
    at the default --batch-size), on the samples plus one clip that is not audio."""
    folder = tmp_path / "clips"
    folder.mkdir()
    for wav in SAMPLES.glob("*.wav"):
        shutil.copy(wav, folder / wav.name)
    (folder / "zz_bad.wav").write_bytes(b"RIFF but not really a wav")
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(app, ["batch", str(folder), "--out", str(out), "--ray", "auto", "--workers", "2"])
    assert result.exit_code == 1, result.output  # one clip failed, as a single-process batch says
    n = len(list(SAMPLES.glob("*.wav")))
    assert f"{n} ok · 1 failed" in result.output
    records = by_name(out)
    bad = records.pop("zz_bad.wav")
    assert {n: comparable(r) for n, r in records.items()} == {n: comparable(r) for n, r in single.items()}
    assert all(r["file"] == str(folder / n) for n, r in records.items())  # named as the driver was given them
    assert bad["file"] == str(folder / "zz_bad.wav") and bad["description"] is None
    assert bad["error"].startswith(f"cannot decode {folder / 'zz_bad.wav'} as audio")
    assert bad["settings"] == records["m_slow_low.wav"]["settings"]

    (folder / "zz_bad.wav").unlink()
    again = CliRunner().invoke(app, ["batch", str(folder), "--out", str(out), "--ray", "auto", "--workers", "2"])
    assert again.exit_code == 0, again.output
    assert f"0 ok · 0 failed · {n} skipped" in again.output  # resumed: nothing run twice
    assert out.read_text(encoding="utf-8").count("\n") == n  # the failed line compacted away


@pytest.mark.parametrize("batch_size", [1, 4])
def test_killed_worker_loses_nothing_and_doubles_nothing(local_ray, single, tmp_path, batch_size):
    """Worker 1 is SIGKILLed by its pid as the run's first record comes back: it holds two tasks from
    its start (one clip each, or a chunk of clips decoded as rows), and its first cannot have
    come back before the first record did, so at least one of them is under way."""
    # 3 copies of each sample under distinct names: enough clips that both workers hold some when one dies.
    folder = tmp_path / "clips"
    folder.mkdir()
    for wav in sorted(SAMPLES.glob("*.wav")):
        for copy in ("a", "b", "c"):
            shutil.copy(wav, folder / f"{copy}_{wav.name}")
    clips = sorted(folder.glob("*.wav"))
    spec = PairSpec.of()
    resolved = spec.settings("fluent")

    events: list[WorkerEvent] = []
    killed: list[int] = []

    def on_done(path: Path, record: dict) -> None:
        pids = {e.index: e.pid for e in events if e.kind == "ready"}
        if not killed and 0 in pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    describe_all = ray_batch.describe_all(RayOptions("auto", workers=2, ship_audio=True),
                                          partial(BatchWorker, spec, resolved, None), batch_size, events.append)
    out = tmp_path / "r.jsonl"
    with ResultsFile(out, resolved.run) as results:
        summary = run_batch(clips, results, None, None, on_done, describe_all=describe_all)

    assert killed, "no worker was killed"
    assert not alive(killed[0])
    restarts = [e for e in events if e.kind == "restarted" and e.index == 0]
    assert restarts and restarts[0].pid != killed[0], f"Ray did not restart the killed worker: {events}"
    assert not [e for e in events if e.kind in ("failed", "lost")], events
    assert (summary.ok, summary.failed, summary.skipped) == (len(clips), 0, 0)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(clips)  # one line per clip: nothing lost, nothing twice
    records = by_name(out)
    assert sorted(records) == sorted(p.name for p in clips)
    for name, record in records.items():
        original = single[name.split("_", 1)[1]]
        assert record["description"] == original["description"], name
        assert record["tokens"] == original["tokens"] and record["cloud_calls"] == original["cloud_calls"]


def test_ray_options_need_ray_installed(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as on a bare install
    result = CliRunner().invoke(app, ["batch", str(SAMPLES), "--out", str(tmp_path / "r.jsonl"), "--ray", "auto"])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {INSTALL_HINT}"
    assert not (tmp_path / "r.jsonl").exists()  # refused before the results file was opened


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: nothing listens there


@pytest.mark.parametrize("args, message", [
    (["--workers", "2"], "go with --ray"),
    (["--shared-path"], "go with --ray"),
    (["--ray", "auto", "--gpus-per-worker", "1"], "add --device cuda"),
    (["--ray", " "], "--ray needs auto or a cluster address"),
    (["--ray", "headnode"], "--ray takes auto, HOST:PORT or ray://HOST:PORT, not 'headnode'"),
    (["--ray", f"127.0.0.1:{closed_port()}"], "no Ray cluster answers at 127.0.0.1:"),
])
def test_ray_option_refusals(tmp_path, args, message):
    result = CliRunner().invoke(app, ["batch", str(SAMPLES), "--out", str(tmp_path / "r.jsonl"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "r.jsonl").exists()


def test_shipped_bytes_read_as_the_file(tmp_path):
    """What a worker gets with --ship-audio: the same samples as reading the file; errors name the clip."""
    wav = SAMPLES / "f_fast_high.wav"
    from_bytes = load_audio(wav, 16000, 30.0, data=wav.read_bytes())
    assert from_bytes.tolist() == load_audio(wav, 16000, 30.0).tolist()
    with pytest.raises(InputError, match="clip.wav is empty"):
        load_audio(tmp_path / "clip.wav", 16000, 30.0, data=b"")
    with pytest.raises(InputError, match="cannot decode .*clip.wav as audio"):
        load_audio(tmp_path / "clip.wav", 16000, 30.0, data=b"not audio at all")


def test_worker_count_refuses_more_than_the_cluster_holds(local_ray):
    with pytest.raises(InputError, match="room for 2 workers"):
        ray_batch._worker_count(ray, RayOptions("10.0.0.1:6379", workers=3))
    with pytest.raises(InputError, match="room for 0 workers"):  # no GPU here
        ray_batch._worker_count(ray, RayOptions("10.0.0.1:6379", gpus_per_worker=1))
    assert ray_batch._worker_count(ray, RayOptions("10.0.0.1:6379")) == 2


class ModelFreeSession:
    """A worker session without models, so that Ray's restarts cost a process, not a load: a clip's
    record says how many bytes the worker got; the clip named `poison` SIGKILLs its own worker,
    first noting its pid in `deaths`."""

    def __init__(self, poison: str, deaths: Path) -> None:
        self.poison, self.deaths = poison, deaths

    def rows(self, batch_size: int) -> int:
        return 1

    def describe(self, files: list[str], read, batch_size: int) -> list[tuple[str, dict]]:
        records = []
        for file in files:
            path = Path(file)
            if path.name == self.poison:
                with open(self.deaths, "a") as f:
                    f.write(f"{os.getpid()}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            records.append((file, {"file": file, "description": f"{len(read(path))} bytes", "error": None}))
        return records

    def error_record(self, file: str, message: str) -> dict:
        return {"file": file, "description": None, "error": message}


def test_a_clip_that_kills_every_worker_is_recorded_failed_once(local_ray, tmp_path):
    """Past Ray's retries (MAX_TASK_RETRIES on one worker) the driver hands the clip out once more,
    alone on an idle worker (RESUBMITS), then records it failed; every other clip, the ones that
    died beside it included, is recorded once, as described."""
    clips = []
    for name in ("a.wav", "b.wav", "poison.wav", "c.wav", "d.wav"):
        (tmp_path / name).write_bytes(name.encode() * 3)
        clips.append(tmp_path / name)
    events: list[WorkerEvent] = []
    describe_all = ray_batch.describe_all(RayOptions("auto", workers=2, ship_audio=True),
                                          partial(ModelFreeSession, "poison.wav", tmp_path / "deaths"), 1,
                                          events.append)
    got = list(describe_all(clips))

    assert sorted(p.name for p, _ in got) == sorted(p.name for p in clips)  # each clip once
    records = {p.name: r for p, r in got}
    for clip in clips:
        if clip.name != "poison.wav":
            assert records[clip.name] == {"file": str(clip), "description": f"{3 * len(clip.name)} bytes",
                                          "error": None}
    poisoned = records["poison.wav"]
    assert poisoned["description"] is None and poisoned["file"] == str(tmp_path / "poison.wav")
    assert poisoned["error"].startswith("its Ray worker died every time it ran")
    deaths = (tmp_path / "deaths").read_text().split()
    assert len(deaths) == len(set(deaths)) == (1 + ray_batch.MAX_TASK_RETRIES) * (1 + ray_batch.RESUBMITS)
    assert not [e for e in events if e.kind in ("failed", "lost")], events  # Ray restarted every one


def unloadable_session() -> ModelFreeSession:
    raise ModelError("cannot load the tokenizer of '/nowhere'")


def test_workers_that_cannot_load_stop_the_run_with_their_reason(local_ray, tmp_path):
    clips = [tmp_path / "a.wav"]
    clips[0].write_bytes(b"x")
    events: list[WorkerEvent] = []
    describe_all = ray_batch.describe_all(RayOptions("auto", workers=2), unloadable_session, 1, events.append)
    with pytest.raises(SpecdecError, match=r"no Ray worker left to describe 1 clip \(worker \d: cannot load the "
                                           r"tokenizer of '/nowhere'\)"):
        list(describe_all(clips))
    assert sorted((e.index, e.kind) for e in events) == [(0, "failed"), (1, "failed")]


def test_a_killed_runs_token_folder_is_removed_at_the_next_start(tmp_path):
    """Issue 55, finding 8: a fleet (or `batch --ray auto`) killed with SIGKILL never reached the
    `finally` that removes its private Ray's token folder (0600 token inside). Now the folder is
    named with its process's pid, and the next start removes the folders whose process is gone:
    not one whose process is alive, nor one of an older specdec (no pid in its name)."""
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{ray_batch.TOKEN_FOLDER}{gone.pid}-abc123"
    alive = tmp_path / f"{ray_batch.TOKEN_FOLDER}{os.getpid()}-def456"
    older = tmp_path / f"{ray_batch.TOKEN_FOLDER}abcdefgh"
    for folder in (dead, alive, older):
        folder.mkdir(mode=0o700)
        (folder / "auth_token").write_text("0" * 64)
    assert ray_batch.remove_orphan_token_folders(tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and older.exists()
