"""schemathesis against a real `specdec serve` process (issue 25): a tool that knows the server only
by its published OpenAPI document (`GET /openapi.json`, generated from wire.py's structs) generates
requests from it, valid and invalid, and checks the answers: never a 5xx, every status and body as
documented, every request the schema forbids refused with a 4xx (negative_data_rejection: the
schema is no looser than the server), and no answer without the token (ignored_auth).

Bounded: at most 10 examples per operation and phase, 30 s for the whole run (well under a minute
on the loaded 2-core machine), a fixed seed. `positive_data_acceptance` is left out: a request the
schema allows may still be refused for what no schema can say (audio that is not FLAC, a prompt
whose audio placeholders do not match its clip); each such refusal is a one-line 4xx, which the
other checks check."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from remote_helpers import Server

TOKEN = "schemathesis-" + "s" * 24
SCHEMATHESIS = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")


@pytest.mark.skipif(SCHEMATHESIS is None, reason="schemathesis is not installed (pip install --config-settings editable_mode=compat -e '.[dev]')")
def test_schemathesis_finds_no_server_error_and_every_answer_as_documented(tmp_path):
    log = tmp_path / "serve.log"
    with Server(env={"SPECDEC_TOKEN": TOKEN}, log=log) as server:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        document = httpx.get(f"{server.url}/openapi.json", headers=headers, timeout=30)
        assert document.status_code == 200
        schema = tmp_path / "openapi.json"
        schema.write_bytes(document.content)
        run = subprocess.run(
            [SCHEMATHESIS, "run", str(schema), "--url", server.url, "-H", f"Authorization: Bearer {TOKEN}",
             "-H", "Accept: application/json", "--checks", "all", "--exclude-checks", "positive_data_acceptance",
             "--max-examples", "10", "--max-time", "30", "--seed", "25", "--workers", "1", "--request-timeout", "60"],
            capture_output=True, text=True, timeout=240, cwd=tmp_path)
        metrics = httpx.get(f"{server.url}/metrics", headers=headers, timeout=30).text
        code, logged = server.stop()
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    generated = re.search(r"(\d+) generated", report)
    assert generated and int(generated.group(1)) >= 100, report[-3000:]  # it really ran
    assert 'specdec_requests_total{status="500"}' not in metrics
    assert code == 0 and "Traceback" not in logged, logged[-3000:]
