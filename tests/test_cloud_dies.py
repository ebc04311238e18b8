"""Issue 44: a cloud that dies in the middle of a run of many clips. The failure is explained once,
at the first clip it touches; the later clips are counted, and one summary line ends the run, in
`describe` and in `batch` alike (before, `describe` printed a ~300-character note per clip and no
summary). The cloud is a real `specdec serve`, SIGKILLed by its pid at its second verification
(tests/cloud_relay.py); a stand-in that answers garbage checks the lines fit an 80-column terminal."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from cloud_relay import Relay
from fake_cloud import FakeCloud, Reply, consistent_verdict, identity, json_reply, msgpack_reply
from remote_helpers import ROOT, SPECDEC, Server

# the first clip escalates at least twice under quality (the server dies at its 2nd verification)
CLIPS = [ROOT / "samples" / name for name in ("f_mid_low_noisy.wav", "f_fast_high.wav", "m_mid_high.wav", "f_fast_low.wav")]
SUMMARY = "the cloud failed on 4 of 4 clips (unreachable); the edge finished them alone"


def killer(server: Server, box: list, at: int):
    def before(n: int) -> bool:
        if n < at:
            return False
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
            box[0].refuse()
        return True
    return before


def run(*args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECDEC_CLOUD_RETRY_S": "1", "SPECDEC_PROGRESS_S": "3600"}
    return subprocess.run([SPECDEC, "--threads", "1", *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """describe and batch of the same four clips, each against a server killed at its 2nd verification."""
    folder = tmp_path_factory.mktemp("clips")
    for i, clip in enumerate(CLIPS):  # numbered: batch takes a folder in name order, describe as given
        shutil.copy(clip, folder / f"{i}-{clip.name}")
    done = {}
    for name, args in (("describe", ["describe", *CLIPS]),
                       ("batch", ["batch", folder, "--out", folder / "r.jsonl"])):
        box: list = []
        with Server() as server, Relay(server.port, killer(server, box, at=2)) as relay:
            box.append(relay)
            done[name] = run(*args, "--preset", "quality", "--cloud", relay.url)
    return done


@pytest.mark.spawns
def test_describe_explains_once_and_sums_up(runs):
    done = runs["describe"]
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 4
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    note, summary = lines
    assert note.startswith(f"note: {CLIPS[0]}: the cloud failed (unreachable): cannot reach the cloud")
    assert "--on-cloud-failure edge" in note
    assert all(str(c) not in done.stderr for c in CLIPS[1:])  # the later clips are counted, not named
    assert summary == SUMMARY and len(summary) <= 80


@pytest.mark.spawns
def test_batch_says_it_the_same_way(runs):
    done = runs["batch"]
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    notes = [line for line in lines if line.startswith("note:")]
    assert len(notes) == 1 and "the cloud failed (unreachable): cannot reach the cloud" in notes[0], done.stderr
    assert lines[-2:] == [SUMMARY, "rerun with --retry-fallback to describe them with the cloud"]


def test_on_an_80_column_terminal_every_line_fits():
    from test_80_columns import WIDTH, too_wide
    from test_80_columns import run as cli

    ident = identity()

    def answer(request):
        if request.path == "/health":
            return json_reply(ident)
        if request.method == "DELETE":
            return Reply(204)
        req = request.verify()
        return msgpack_reply(consistent_verdict(req, accepted=len(req.draft) + 10, kind="bonus"))

    with FakeCloud(answer) as fake:
        done = cli("describe", *map(str, CLIPS[:3]), "--cloud", fake.url, "--max-new-tokens", "12", "--no-live",
                   "--no-trace", "--no-panel", terminal=True)
    assert done.exit_code == 0, done.output
    assert too_wide(done.stderr) == []
    said = " ".join(done.stderr.split())
    assert said.count("the cloud failed (unusable)") == 1
    assert said.endswith("the cloud failed on 3 of 3 clips (unusable); the edge finished them alone")
    assert WIDTH == 80
