"""Issue 43, the depth as an option: RemoteClient.depth bounded to 1..MAX_DEPTH (or "auto"), the
rule `auto` follows (decoding/block_length.py's best_depth, against hand-computed cases), and
`--depth` on every command that takes `--cloud URL`, reaching the client."""

from __future__ import annotations

import pytest

from specdec_cli.decoding.block_length import MAX_DEPTH, best_depth, clean_block, parse_depth
from specdec_cli.errors import InputError
from specdec_cli.remote.client import RemoteClient


@pytest.mark.parametrize("bad", [0, -1, 5, 99, "0", "5", "two", "", "2.5", 2.5, True, None])
def test_a_depth_outside_one_to_max_is_refused_in_one_line(bad):
    client = RemoteClient("http://127.0.0.1:9")  # nothing is sent until a request
    try:
        with pytest.raises(InputError) as caught:
            client.depth = bad
    finally:
        client.close()
    message = str(caught.value)
    assert "\n" not in message and f"1 to {MAX_DEPTH}" in message and "auto" in message, message
    assert caught.value.exit_code == 2
    assert client.depth == 1  # unchanged


@pytest.mark.parametrize("good, expected", [(1, 1), (4, 4), ("3", 3), (" 2 ", 2), ("auto", "auto"), ("AUTO", "auto")])
def test_a_depth_in_range_is_kept(good, expected):
    client = RemoteClient("http://127.0.0.1:9")
    try:
        client.depth = good
        assert client.depth == expected
    finally:
        client.close()
    assert parse_depth(good) == expected


def test_max_depth_is_what_the_server_queues_per_session():
    from specdec_cli.remote import client, sessions

    assert MAX_DEPTH == client.MAX_DEPTH == sessions.MAX_QUEUED == 4


# -- the auto rule, by hand -------------------------------------------------------------------------

def test_clean_block_by_hand():
    assert clean_block(3, 0.5) == pytest.approx(0.0625)      # 0.5^4
    assert clean_block(1, 0.9) == pytest.approx(0.81)
    assert clean_block(12, 1.0) == 1.0


def test_auto_depth_hand_computed_cases():
    # a = 1 (every block clean): D = 1 + ceil(wait / (k t_edge)), at most 4.
    assert best_depth(0.050, 0.010, 4, 1.0) == 3      # 50 / 40 = 1.25 -> 2 blocks drafted per wait: 3
    assert best_depth(0.040, 0.010, 4, 1.0) == 2      # 40 / 40 = 1 -> 2
    assert best_depth(0.010, 0.010, 4, 1.0) == 2      # 10 / 40 -> ceil 1 -> 2
    assert best_depth(0.150, 0.005, 2, 1.0) == 4      # 150 / 10 = 15 -> capped at MAX_DEPTH
    assert best_depth(0.150, 0.005, 2, 1.0, max_depth=8) == 8
    # Below 10 ms of wait (a loopback): one in flight, however clean.
    assert best_depth(0.0, 0.010, 4, 1.0) == 1
    assert best_depth(0.0099, 0.0001, 4, 1.0) == 1
    # a = 0.9, k = 2: clean 0.729 >= 0.3: the wait decides; 0.0535 / (2 * 0.02) = 1.34 -> 3.
    assert best_depth(0.0535, 0.02, 2, 0.9) == 3
    # a = 0.8, k = 5: clean 0.8^6 = 0.262 < 0.3: one in flight whatever the wait.
    assert best_depth(1.0, 0.001, 5, 0.8) == 1
    # a = 0.8, k = 4: clean 0.8^5 = 0.328 >= 0.3: 0.010 / 0.004 = 2.5 -> 1 + 3 = 4.
    assert best_depth(0.010, 0.001, 4, 0.8) == 4
    # The demo pair's quality (k 12, a 0.44): clean ~ 2e-5 on the independent model: 1 ...
    assert best_depth(0.0535, 0.0004, 12, 0.44) == 1
    # ... but a measured share of whole blocks replaces a^(k+1): 0.47 clean, 53.5 / 4.8 -> 4.
    assert best_depth(0.0535, 0.0004, 12, 0.44, clean=0.47) == 4
    assert best_depth(0.0535, 0.0004, 12, 0.44, clean=0.29) == 1
    assert best_depth(0.0535, 0.0060, 12, 1.0, clean=1.0) == 2  # 53.5 / 72 -> 1 -> 2


@pytest.mark.parametrize("args", [(-1.0, 0.01, 4, 1.0), (float("nan"), 0.01, 4, 1.0), (0.1, 0.0, 4, 1.0),
                                  (0.1, 0.01, 0, 1.0), (0.1, 0.01, 4, 1.5), (0.1, 0.01, 4, 1.0, 1.2)])
def test_auto_depth_refuses_impossible_figures(args):
    with pytest.raises(ValueError):
        best_depth(*args)


def test_auto_depth_on_the_client_follows_the_recent_acceptance():
    client = RemoteClient("http://127.0.0.1:9")
    try:
        client.depth = "auto"
        client.rtt_s, client.edge_token_s = 0.050, 0.010  # as if measured: no probe is sent
        assert client.depth_for(None, 4) == 1              # none measured: a = 0.6, 0.6^5 = 0.08 < 0.3
        client.recent.extend([(4, 4)] * 10)                # every draft kept: all clean
        assert client.depth_for(None, 4) == 3
        client.recent.extend([(1, 4)] * 20)                # 10 clean of 30: 0.33
        assert client.depth_for(None, 4) == 3
        client.recent.extend([(0, 4)] * 20)                # 10 of 50: 0.2
        assert client.depth_for(None, 4) == 1
        client.recent.clear()
        client.recent.extend([(4, 4)] * 10)
        client.rtt_s = 0.004                               # a loopback: one in flight
        assert client.depth_for(None, 4) == 1
        client.depth = 2
        assert client.depth_for(None, 4) == 2              # a depth set is kept as set
    finally:
        client.close()


# -- --depth on the command line --------------------------------------------------------------------

CLOUD_COMMANDS = ("describe", "batch", "eval", "calibrate")  # every command with --cloud URL


def test_every_command_with_cloud_has_depth():
    from typer.testing import CliRunner

    from specdec_cli.commands.app import app

    for command in CLOUD_COMMANDS:
        text = CliRunner().invoke(app, [command, "--help"], terminal_width=80).output
        assert "--cloud" in text and "--depth" in text and "1-4|auto" in text, command


@pytest.fixture(scope="module")
def server():
    from remote_helpers import Server

    with Server() as s:
        yield s


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    import shutil

    from remote_helpers import ROOT

    folder = tmp_path_factory.mktemp("clips")
    for path in sorted((ROOT / "samples").glob("*.wav"))[:2]:
        shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture
def depths(monkeypatch):
    """The depth each clip's loop decoded with (the describer's call of speculative_decode)."""
    from specdec_cli import decoding
    from specdec_cli.decoding import loop

    seen: list[int] = []

    def spying(*args, **kwargs):
        seen.append(kwargs.get("depth", 1))
        return loop.speculative_decode(*args, **kwargs)
    monkeypatch.setattr(decoding, "speculative_decode", spying)
    return seen


def invoke(*args: str):
    from typer.testing import CliRunner

    from specdec_cli.commands.app import app

    return CliRunner().invoke(app, list(args))


GREEDY_ALWAYS = ("--verify", "always", "--k", "3", "--greedy")


def test_describe_depth_reaches_the_loop_and_changes_no_token(server, clips, depths):
    import json

    for clip in sorted(clips.glob("*.wav")):
        here = invoke("describe", str(clip), "--json", *GREEDY_ALWAYS)
        assert here.exit_code == 0, here.output
        for depth in ("3", "auto"):
            depths.clear()
            there = invoke("describe", str(clip), "--json", *GREEDY_ALWAYS, "--cloud", server.url, "--depth", depth)
            assert there.exit_code == 0, there.output
            assert json.loads(there.stdout)["tokens"] == json.loads(here.stdout)["tokens"], (clip.name, depth)
            assert depths and all(d == 3 for d in depths) if depth == "3" else all(1 <= d <= 4 for d in depths)


def test_batch_and_eval_depth_reach_the_loop(server, clips, depths, tmp_path):
    from specdec_cli.results import read_records

    here, there = tmp_path / "here.jsonl", tmp_path / "there.jsonl"
    assert invoke("batch", str(clips), "--out", str(here), *GREEDY_ALWAYS).exit_code == 0
    depths.clear()
    done = invoke("batch", str(clips), "--out", str(there), *GREEDY_ALWAYS, "--cloud", server.url, "--depth", "2")
    assert done.exit_code == 0, done.output
    assert depths == [2, 2], depths
    tokens = {r["file"]: r["tokens"] for r in read_records(here)}
    assert {r["file"]: r["tokens"] for r in read_records(there)} == tokens
    depths.clear()
    done = invoke("eval", str(clips), "--modes", "always", "--json", "--cloud", server.url, "--depth", "4")
    assert done.exit_code == 0, done.output
    assert depths and set(depths) == {4}, depths


def test_the_library_pair_takes_depth(server):
    from specdec import Pair

    pair = Pair(cloud=server.url, depth=3)
    assert pair.models.remote.depth == 3
    with pytest.raises(InputError, match="1 to 4"):
        Pair(cloud=server.url, depth=7)


@pytest.mark.parametrize("command", CLOUD_COMMANDS)
@pytest.mark.parametrize("bad", ["0", "5", "deep"])
def test_a_bad_depth_is_one_line_exit_2(command, bad, clips, tmp_path):
    import os
    import subprocess

    from remote_helpers import ROOT, SPECDEC

    where = str(clips if command != "describe" else sorted(clips.glob("*.wav"))[0])
    extra = ["--out", str(tmp_path / "r.jsonl")] if command == "batch" else []
    if command == "calibrate":
        extra = ["--out", str(tmp_path / "p.toml")]
    done = subprocess.run([SPECDEC, command, where, *extra, "--depth", bad], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=ROOT)
    assert done.returncode == 2, (command, done.stderr)
    # (eval says first, on a line of its own, that the folder has no labels)
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr and [line for line in lines if "--depth" in line] == lines[-1:], lines
    assert lines[-1].startswith("error: --depth") and "1 to 4" in lines[-1], lines


# -- the link measurement under the clip's deadline (issue 55, finding 3) --------------------------

def standin(later_health):
    """A stand-in server (fake_cloud.FakeCloud): its first /health is a real server's, every later
    one `later_health` (a proxy's 502 page, or one that never comes); verifications get a
    consistent verdict."""
    from fake_cloud import FakeCloud, Reply, consistent_verdict, identity, json_reply, msgpack_reply

    def answer(request):
        if request.path == "/health":
            first = sum(r.path == "/health" for r in fake.requests) == 1
            return json_reply(identity()) if first else later_health
        if request.method == "DELETE":
            return Reply(204)
        return msgpack_reply(consistent_verdict(request.verify()))
    fake = FakeCloud(answer)
    return fake


def run_against(fake, command: str, clips, tmp_path, *args: str):
    from cli_helpers import FAST, run_specdec

    out = ["--out", str(tmp_path / "out.jsonl")] if command == "batch" else ["--json"]
    where = [str(clips)] if command == "batch" else [str(sorted(clips.glob("*.wav"))[0])]
    live = ["--no-live"] if command == "describe" else []  # (batch has no live view)
    return run_specdec("--threads", "1", command, *where, "--cloud", fake.url, *FAST, *live, *args, *out,
                       timeout=300)


def described(done, command: str, tmp_path) -> int:
    """How many clips the run described (records with a description and no error)."""
    import json

    if command == "batch":
        from specdec_cli.results import read_records

        records = read_records(tmp_path / "out.jsonl")
    else:
        records = [json.loads(line) for line in done.stdout.splitlines()]
    return sum(r["description"] is not None and r["error"] is None for r in records)


PROXY_502 = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


@pytest.mark.spawns
@pytest.mark.parametrize("command, args", [("describe", ("--depth", "auto")), ("describe", ("--verify", "always")),
                                           ("batch", ("--depth", "auto"))])
def test_a_link_measurement_answered_502_leaves_depth_one_and_the_run_describes(command, args, clips, tmp_path):
    """Before: a /health answered 502 text/html after the first (a proxy that lost its server a
    moment) failed the measurement for --depth auto (or for k where it is free: --verify always),
    and with it the clip: describe and batch exited 1 with no description (the batch wrote 0
    records). Now the run goes on unmeasured, at depth 1 with the preset's k; the measurement is
    not tried again (two /health in all: the start's and the one that failed)."""
    from fake_cloud import Reply

    with standin(Reply(502, PROXY_502, {"content-type": "text/html"})) as fake:
        done = run_against(fake, command, clips, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert described(done, command, tmp_path) == (2 if command == "batch" else 1), done.stderr
    assert sum(r.path == "/health" for r in fake.requests) == 2
    assert any(r.path == "/v1/verify" for r in fake.requests)


@pytest.mark.spawns
def test_a_link_measurement_that_gets_no_answer_gives_up_within_the_deadline(clips, tmp_path):
    """Before: a /health that took 40-50 s held the measurement that long per call (three calls,
    each retried), and the clip took 127-208 s against its 10 s --cloud-deadline; here one that never
    answers held it for the request's timeout (15 s) and then failed the clip (exit 1). Now each
    call of the measurement is bounded (2 s, within the clip's deadline) and tried once: the clip
    is described, after one unanswered /health."""
    from fake_cloud import Reply

    with standin(Reply(hang=True)) as fake:
        done = run_against(fake, "describe", clips, tmp_path, "--depth", "auto", "--cloud-deadline", "10",
                           "--cloud-timeout", "15")
    assert done.returncode == 0, done.stderr
    assert described(done, "describe", tmp_path) == 1
    assert sum(r.path == "/health" for r in fake.requests) == 2
    assert any(r.path == "/v1/verify" for r in fake.requests)
