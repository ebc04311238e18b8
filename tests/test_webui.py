"""`specdec ui`'s server (issue 54), without a browser: the page's endpoint describes an upload as
the library describes the same file (the oracle: Pair.describe on the file's path, in process), its
errors are the library's own lines with the upload's name for the path and never a traceback, and
it serves nothing that is not its own: no other host in any asset, a Content-Security-Policy that
forbids them, every asset in the package data. The browser itself: tests/test_ui_page.py."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest
from cli_helpers import bad_corpus
from starlette.testclient import TestClient

from specdec import InputError, Pair
from specdec_cli.webui.page import STATIC, Page, allowed_hosts, create_app, max_upload_bytes, upload_name

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "f_mid_mid_loud.wav"


@pytest.fixture(scope="module")
def pair() -> Pair:
    return Pair()


@pytest.fixture(scope="module")
def client(pair) -> TestClient:
    return TestClient(create_app(Page(pair), allowed_hosts("127.0.0.1")), base_url="http://127.0.0.1:7860")


def events(response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def post(client: TestClient, data: bytes, **query: str):
    return client.post("/api/describe", params=query, content=data,
                       headers={"Content-Type": "application/octet-stream"})


def test_an_upload_is_described_as_the_library_describes_the_file(client, pair):
    got = events(post(client, SAMPLE.read_bytes(), preset="quality", name=SAMPLE.name))
    want = pair.describe(str(SAMPLE), preset="quality")
    kinds = [e["type"] for e in got]
    assert kinds == ["start"] + ["block"] * len(want.events) + ["done"]
    quality = pair.settings("quality")  # the bundled presets file's (v5: 0.787, k 8)
    assert got[0]["rule"] == f"escalate when ΣH > {quality.threshold:g} · k {quality.k} · verify entropy"
    done = got[-1]
    assert done["sentence"] == want.description
    record = json.loads(done["record"])
    assert record["file"] == SAMPLE.name  # the upload's name, not a temporary path
    skip = {"file", "latency_s", "tokens_per_s", "latency_modelled_s"}
    assert {k: v for k, v in record.items() if k not in skip} == \
           {k: v for k, v in json.loads(json.dumps(want.record)).items() if k not in skip}
    # Block by block: the sentence grows to the description; each block's verdicts are the events'.
    blocks = [e for e in got if e["type"] == "block"]
    assert blocks[-1]["sentence"] == want.description
    for shown, event in zip(blocks, want.events, strict=True):
        assert [t["verdict"] == "accepted" for t in shown["tokens"]].count(True) == (
            event.accepted if event.escalated else 0)
        assert shown["where"] == ("cloud" if event.escalated else "edge")
        assert len(shown["tokens"]) == len(event.draft)
        assert (shown["correction"] is not None) == (event.correction is not None)


@pytest.mark.parametrize("kind", ["empty", "not_audio", "too_short", "nan", "silent", "no_samples", "too_long"])
def test_a_bad_upload_is_the_librarys_one_line_with_its_name(client, pair, tmp_path, kind):
    path, phrase = bad_corpus(tmp_path)[kind]
    response = post(client, path.read_bytes(), name=path.name)
    text = response.text
    assert "Traceback" not in text and 'File "' not in text
    if kind == "empty":  # refused before any decoding: a 400 with the line
        assert response.status_code == 400
        assert response.json()["error"] == f"{path.name} is empty (0 bytes); choose an audio file or record one"
        return
    error = events(response)[-1]
    assert error["type"] == "error"
    with pytest.raises(InputError) as raised:  # the oracle: the library, given the file on disk (the same
        pair.describe(str(path), preset="quality")  # Pair as the page's: its hint for a clip over the window)
    assert error["message"] == raised.value.message.replace(str(path), path.name)
    assert phrase in error["message"]
    assert json.loads(error["record"])["error"] == error["message"]
    if kind == "too_long":  # the page's own advice, not the command line's --segment alone
        assert error["message"] == (f"{path.name} is 31.0 s long; the model takes at most 30 s per clip: record "
                                    "or cut a shorter one (`specdec describe FILE --segment` describes a long "
                                    "recording in segments)")


def test_a_low_rate_clip_is_described_with_the_librarys_warning_as_a_note(client, tmp_path):
    import soundfile as sf
    import soxr

    speech, rate = sf.read(ROOT / "samples" / "f_fast_low.wav", dtype="float32")
    clip = tmp_path / "phone.wav"
    sf.write(clip, soxr.resample(speech, rate, 8000), 8000)  # a bundled voice at a telephone's rate
    got = events(post(client, clip.read_bytes(), name="phone.wav"))
    notes = [e["message"] for e in got if e["type"] == "note"]
    assert notes == ["phone.wav is recorded at 8000 Hz, below the models' 16000 Hz: it is upsampled, which adds no "
                     "detail, and the description may differ from a recording at the full rate"]
    assert got[-1]["type"] == "done"
    # Each clip warns again (a warnings filter shows a message once per place by default).
    again = events(post(client, clip.read_bytes(), name="phone.wav"))
    assert [e["message"] for e in again if e["type"] == "note"] == notes


def test_an_unknown_preset_and_an_oversized_body_are_refused_in_one_line(client, pair):
    response = post(client, b"RIFF", preset="turbo")
    assert response.status_code == 400
    assert response.json() == {"error": "no preset named 'turbo'; choose one of fluent, frugal, quality"}
    small = Page(pair)
    small.max_bytes = 1000
    tiny = TestClient(create_app(small, ["127.0.0.1"]), base_url="http://127.0.0.1:7860")
    response = post(tiny, SAMPLE.read_bytes(), name="big.wav")
    assert response.status_code == 413
    assert response.json()["error"].startswith("big.wav is over 0 MB, larger than any clip of at most 30 s")


def test_the_largest_upload_is_the_longest_clip_specdec_decodes():
    # 30 s at 768,000 samples per second (384 kHz stereo) of 64-bit floats, plus 1 MiB: 185.4 MB.
    assert max_upload_bytes(30.0) == 30 * 768_000 * 8 + 1048576


def test_other_origins_and_hosts_are_refused(client):
    response = client.post("/api/describe", content=b"x", headers={"Origin": "http://elsewhere.example"})
    assert response.status_code == 403
    assert response.json() == {"error": "this page describes clips sent from itself only"}
    assert client.get("/api/info", headers={"Host": "rebound.example"}).status_code == 400
    assert client.get("/api/info", headers={"Host": "localhost:7860"}).status_code == 200


def test_the_page_names_its_pair_and_presets(client, pair):
    info = client.get("/api/info").json()
    assert [p["name"] for p in info["presets"]] == ["fluent", "frugal", "quality"]
    assert info["default_preset"] == "fluent"
    assert info["cloud_url"] is None and info["max_seconds"] == pair.max_seconds


@pytest.mark.parametrize("given, shown", [
    ("clip.wav", "clip.wav"), ("C:\\Users\\me\\voice.flac", "voice.flac"), ("../../etc/passwd", "passwd"),
    ("", "upload"), (None, "upload"), ("..", "upload"), ("a\nb\x1b[2J.wav", "a\\nb\\x1b[2J.wav"),
    ("x" * 300 + ".wav", "x" * 100),
])
def test_an_uploads_name_is_its_last_part_printable(given, shown):
    assert upload_name(given) == shown


def test_every_asset_is_the_packages_own(client):
    page = client.get("/")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "http" not in csp
    html = page.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sorted(assets) == ["/static/page.css", "/static/page.js", "data:,"]
    for path in STATIC.iterdir():
        served = client.get(f"/static/{path.name}")
        assert served.status_code == 200 and served.content == path.read_bytes()
        # No other host is named anywhere in the page's files (a CDN, a font service).
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", path.read_text(encoding="utf-8")), path.name
    # The package data carries every file the page serves (a wheel install has them).
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["specdec_cli"]
    for path in STATIC.rglob("*"):
        rel = path.relative_to(ROOT / "specdec_cli").as_posix()
        assert any(fnmatch.fnmatch(rel, glob) for glob in data), rel


def test_a_closed_stream_stops_at_its_next_block(pair):
    full = pair.describe(str(SAMPLE), preset="quality")
    assert len(full.events) >= 3
    stream = pair.stream(str(SAMPLE), preset="quality")
    seen = []
    for event in stream:
        seen.append(event)
        stream.close()
    assert len(seen) < len(full.events)  # at most a block decided while close() was on its way
    assert stream.result is None


def test_a_clip_given_as_bytes_is_named_not_opened(pair, tmp_path):
    result = pair.describe("named-only.wav", preset="quality", data=SAMPLE.read_bytes())
    assert not (Path.cwd() / "named-only.wav").exists()
    assert result.record["file"] == "named-only.wav"
    assert result.description == pair.describe(str(SAMPLE), preset="quality").description


# -- the command: what it refuses before any model loads ----------------------------------------------

def run_ui(*args: str):
    from typer.testing import CliRunner

    from specdec_cli.commands.app import app

    return CliRunner().invoke(app, ["ui", *args], env={"COLUMNS": "80", "NO_COLOR": "1"})


def test_an_unknown_preset_or_a_port_in_use_is_one_line_before_loading():
    import socket

    done = run_ui("--preset", "turbo", "--port", "0")
    assert done.exit_code == 2
    assert done.output.startswith("error: unknown preset 'turbo'")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = run_ui("--port", str(port))
    assert done.exit_code == 2
    assert done.output == (f"error: port {port} on 127.0.0.1 is already in use (another specdec serve?); stop it, "
                           "give another --port, or --port 0 for any free one\n")


def test_an_address_beyond_loopback_is_warned_about():
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the bind fails, after the warning, with no traffic.
    done = run_ui("--host", "192.0.2.1", "--port", "0")
    assert done.exit_code == 2
    warning, error = done.output.splitlines()
    assert warning.startswith("warning: listening on 192.0.2.1: anyone who reaches this port can use the page")
    assert error.startswith("error: cannot listen on 192.0.2.1 port 0:")


def test_the_pages_element_ids_are_unique_and_the_script_finds_each_one():
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids))  # a second id="record" once made the record's JSON land in the button
    script = (STATIC / "page.js").read_text(encoding="utf-8")
    assert set(re.findall(r'\$\("([^"]+)"\)', script)) <= set(ids)


@pytest.mark.spawns
def test_with_a_remote_cloud_the_page_says_which_and_the_record_counts_the_link(pair):
    from specdec_cli.remote.local_server import LocalServer

    server = LocalServer().start()
    try:
        remote = Pair(cloud=server.url, on_cloud_failure="fail")
        client = TestClient(create_app(Page(remote), ["127.0.0.1"]), base_url="http://127.0.0.1:7860")
        info = client.get("/api/info").json()
        assert info["cloud_url"] == server.url and info["cloud_label"] == server.url
        done = events(post(client, SAMPLE.read_bytes(), preset="quality", name=SAMPLE.name))[-1]
        record = json.loads(done["record"])
    finally:
        server.stop()
    assert record["cloud_url"] == server.url
    assert record["uplink_bytes"] > 0 and record["round_trips"] >= record["cloud_calls"] >= 1
    # The sentence is the in-process cloud's, token for token (docs/serve.md).
    assert done["sentence"] == pair.describe(str(SAMPLE), preset="quality").description
