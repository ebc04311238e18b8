"""The edge answers alone when the cloud cannot (issue 35, item 4): `--on-cloud-failure edge`.

Oracle: the edge's own greedy continuation, computed independently of the loop — HF `generate` on
the edge model alone, forced through the prefix the clip had when the cloud failed, under the same
decoding rules (processors and stop rule) as every mode. The prefix itself is the in-process
speculative run's (a remote cloud gives the same tokens, tests/test_remote.py), cut at the record's
`fallback_at_tokens`. The clouds that fail are real: a `specdec serve` killed by its pid mid-clip
(behind a relay that counts its verifications), a stand-in that answers garbage, a real server
behind a slow link with a whole-clip deadline; and, in process, a cloud whose n-th verdict fails,
at every n.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from cloud_relay import Relay
from fake_cloud import FakeCloud, Reply, consistent_verdict, identity, json_reply, msgpack_reply
from remote_helpers import ROOT, SPECDEC, Server

CLIP = ROOT / "samples/f_slow_low_quiet.wav"   # three verifications under quality in process (v5 pair)
OTHERS = [ROOT / "samples/f_fast_high.wav", ROOT / "samples/m_mid_high.wav"]


@pytest.fixture(scope="module")
def pair():
    from specdec import Pair

    return Pair()


def edge_from(pair, clip: Path, prefix: list[int], preset: str = "quality", **settings) -> list[int]:
    """The answer the edge alone gives after `prefix`: HF generate on the edge, the prompt and
    `prefix` as its input, the loop's processors and stop rule (built for the clip's prompt, so
    `prefix` counts as answer), at most max_new_tokens in all."""
    from specdec_cli.decoding.baselines import generation_config
    from specdec_cli.decoding.processors import DecodingRules

    cfg = pair.settings(preset, **settings)
    models = pair.models
    _, audio = pair.read(clip)
    inputs = pair.describer.inputs(audio, cfg)
    prompt_len = int(inputs["input_ids"].shape[1])
    rules = DecodingRules.build(cfg, models.masks, prompt_len, models.eos_ids)
    ids = torch.cat([inputs["input_ids"], torch.tensor([prefix], dtype=torch.long).reshape(1, -1)], 1)
    given = {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    models.edge.model.rope_deltas = None
    gen = generation_config(cfg.with_(max_new_tokens=cfg.max_new_tokens - len(prefix)), models.eos_ids,
                            models.tokenizer.pad_token_id)
    with torch.inference_mode():
        out = models.edge.generate(**given, generation_config=gen, logits_processor=rules.processors,
                                   stopping_criteria=[rules.sentence_end])
    return out[0, prompt_len:].tolist()


def expected(pair, clip: Path, at: int, preset: str = "quality", **settings) -> tuple[str, int]:
    """(description, tokens) of a clip whose cloud failed with `at` answer tokens decided."""
    prefix = pair.describe(clip, preset=preset, **settings).token_ids[:at]
    tokens = edge_from(pair, clip, prefix, preset, **settings)
    assert tokens[:at] == prefix
    return pair.text(tokens).strip(), len(tokens)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([SPECDEC, "--threads", "1", *map(str, args)], capture_output=True, text=True, env=full,
                          cwd=ROOT, timeout=300)


def test_the_oracle_without_a_prefix_is_edge_only(pair):
    """The oracle's own check: forced through nothing, it is `--mode edge`."""
    assert edge_from(pair, CLIP, []) == pair.describe(CLIP, preset="quality", mode="edge").token_ids


# -- in process: a cloud whose n-th verdict fails, at every n ---------------------------------------

class Lost(Exception):
    cloud_failure = "unreachable"


def failing_cloud(model, fail_at: int, late_s: float = 0.0):
    """A LocalCloud whose `fail_at`-th verdict is a Lost (after `late_s`: in flight, so the loop
    drafts the next block ahead meanwhile)."""
    from specdec_cli.decoding.verifier import LocalCloud

    class Failing(LocalCloud):
        calls = 0

        def submit(self, *args, **kwargs):
            self.calls += 1
            if self.calls < fail_at:
                return super().submit(*args, **kwargs)
            future: Future = Future()
            threading.Timer(late_s, future.set_exception, (Lost("the cloud went away"),)).start()
            return future

    return Failing(model)


@pytest.mark.parametrize("late_s", [0.0, 0.05])
def test_the_edge_finishes_from_where_the_cloud_failed_at_every_verification(pair, late_s):
    from specdec_cli.decoding import speculative_decode

    models = pair.models
    cfg = pair.settings("quality")
    _, audio = pair.read(CLIP)
    whole = pair.describe(CLIP, preset="quality")
    assert whole.cloud_calls >= 3
    for n in range(1, whole.cloud_calls + 1):
        cloud = failing_cloud(models.cloud, n, late_s)
        result = speculative_decode(models.edge, cloud, pair.describer.inputs(audio, cfg), cfg, models.masks,
                                    models.eos_ids, fallback=True)
        lost = result.lost
        assert lost is not None and lost.failure == "unreachable" and lost.error == "Lost: the cloud went away"
        assert result.tokens[:lost.at] == whole.token_ids[:lost.at]
        assert result.tokens == edge_from(pair, CLIP, whole.token_ids[:lost.at]), n
        # The n-1 verdicts before: the cloud had checked the answer up to the last one's token.
        verdicts = [e for e in whole.events if e.escalated][:n - 1]
        assert lost.verified == (len(verdicts[-1].answer) if verdicts else 0) <= lost.at
        assert [e.fallback for e in result.events].count("unreachable") == 1
        assert sum(e.escalated for e in result.events) == n  # nothing went up after the failure


def test_without_fallback_or_for_a_bug_the_failure_is_the_clips(pair):
    from specdec_cli.decoding import speculative_decode

    models = pair.models
    cfg = pair.settings("quality")
    _, audio = pair.read(CLIP)
    with pytest.raises(Lost):
        speculative_decode(models.edge, failing_cloud(models.cloud, 2), pair.describer.inputs(audio, cfg), cfg,
                           models.masks, models.eos_ids)
    bug = failing_cloud(models.cloud, 1)
    broken: Future = Future()
    broken.set_exception(RuntimeError("a bug"))  # no cloud_failure: never taken for the cloud's
    bug.submit = lambda *a, **k: broken
    with pytest.raises(RuntimeError, match="a bug"):
        speculative_decode(models.edge, bug, pair.describer.inputs(audio, cfg), cfg, models.masks, models.eos_ids,
                           fallback=True)


# -- a real server, killed by its pid mid-batch ------------------------------------------------------

def killer(server: Server, relay_box: list, at: int):
    """before_verify: at the `at`-th verification, SIGKILL the server (by its pid) and stop
    accepting connections, as a dead server's port does; that request and any later one die."""
    def before(n: int) -> bool:
        if n < at:
            return False
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
            relay_box[0].refuse()
        return True
    return before


def records(path: Path) -> dict[str, dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {Path(r["file"]).name: r for r in lines}


@pytest.mark.spawns
def test_a_cloud_killed_mid_batch_leaves_each_clip_to_the_edge_and_a_rerun_retries_them(tmp_path, pair):
    clips = tmp_path / "clips"
    clips.mkdir()
    for i, source in enumerate([CLIP, *OTHERS]):
        shutil.copy(source, clips / f"{i}.wav")
    out = tmp_path / "r.jsonl"
    env = {"SPECDEC_CLOUD_RETRY_S": "1"}
    box: list = []
    with Server() as server, Relay(server.port, killer(server, box, at=2)) as relay:
        box.append(relay)
        done = run("batch", clips, "--out", out, "--preset", "quality", "--cloud", relay.url, env=env)
    assert done.returncode == 0, done.stderr
    assert "the cloud failed on 3 of 3 clips (unreachable); the edge finished them alone\nrerun " \
           "with --retry-fallback" in done.stderr, done.stderr
    got = records(out)
    assert sorted(got) == ["0.wav", "1.wav", "2.wav"] and all(r["error"] is None for r in got.values())
    first = got["0.wav"]  # killed at its second verification: one verdict came back
    assert first["fallback"] == "unreachable" and first["fallback_verified_tokens"] > 0
    assert "cannot reach the cloud" in first["fallback_error"]
    assert first["fallback_at_tokens"] >= first["fallback_verified_tokens"]
    for name, source in zip(("0.wav", "1.wav", "2.wav"), [CLIP, *OTHERS], strict=True):
        r = got[name]
        assert r["fallback"] == "unreachable"
        assert (r["description"], r["tokens"]) == expected(pair, source, r["fallback_at_tokens"]), name
    for later in ("1.wav", "2.wav"):  # the cloud was known down: each gave up at its first escalation
        assert got[later]["fallback_verified_tokens"] == 0

    with Server() as again:
        kept = run("batch", clips, "--out", out, "--preset", "quality", "--cloud", again.url, env=env)
        assert kept.returncode == 0 and "3 skipped" in kept.stderr, kept.stderr
        assert records(out) == got
        retried = run("batch", clips, "--out", out, "--preset", "quality", "--cloud", again.url, "--retry-fallback",
                      env=env)
    assert retried.returncode == 0 and "edge finished" not in retried.stderr, retried.stderr
    now = records(out)
    assert len(out.read_text().splitlines()) == 3
    for name, source in zip(("0.wav", "1.wav", "2.wav"), [CLIP, *OTHERS], strict=True):
        assert now[name]["fallback"] is None and now[name]["description"] == pair.describe(source, preset="quality").description


@pytest.mark.spawns
def test_with_fail_a_cloud_killed_mid_clip_fails_it_in_one_line(tmp_path):
    box: list = []
    with Server() as server, Relay(server.port, killer(server, box, at=2)) as relay:
        box.append(relay)
        done = run("describe", CLIP, "--preset", "quality", "--cloud", relay.url, "--on-cloud-failure", "fail",
                   env={"SPECDEC_CLOUD_RETRY_S": "1"})
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: cannot reach the cloud at {relay.url} ")


# -- garbage, and a missed deadline --------------------------------------------------------------------

@pytest.mark.spawns
def test_a_cloud_answering_garbage_leaves_the_clip_to_the_edge(pair):
    def answer(request):
        if request.path == "/health":
            return json_reply(identity())
        if request.method == "DELETE":
            return Reply(204)
        req = request.verify()
        return msgpack_reply(consistent_verdict(req, accepted=len(req.draft) + 10, kind="bonus"))
    with FakeCloud(answer) as fake:
        done = run("describe", CLIP, "--preset", "quality", "--cloud", fake.url, "--json", "--max-new-tokens", "20")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["fallback"] == "unusable" and record["fallback_verified_tokens"] == 0
    assert "the verdict accepts" in record["fallback_error"] and record["error"] is None
    want = expected(pair, CLIP, record["fallback_at_tokens"], max_new_tokens=20)
    assert (record["description"], record["tokens"]) == want
    assert done.stderr.startswith(f"note: {CLIP}: the cloud failed (unusable)") and done.stderr.count("\n") == 1


@pytest.mark.spawns
def test_a_cloud_too_slow_for_the_clips_deadline_leaves_the_rest_to_the_edge(pair):
    """A real server behind a link that holds every chunk 0.4 s: the three verifications quality
    makes of this clip cannot fit in a 1.5 s budget for the whole clip."""
    with Server() as server, Relay(server.port, delay_s=0.4) as slow:
        done = run("describe", CLIP, "--preset", "quality", "--cloud", slow.url, "--json", "--cloud-deadline", "1.5")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["fallback"] == "deadline" and "--cloud-deadline" in record["fallback_error"]
    assert (record["description"], record["tokens"]) == expected(pair, CLIP, record["fallback_at_tokens"])


@pytest.mark.spawns
def test_a_bad_deadline_or_choice_is_refused_in_one_line():
    for args, phrase in ((["--cloud-deadline", "0"], "--cloud-deadline must be a positive number"),
                         (["--cloud-deadline", "nan"], "--cloud-deadline must be a positive number")):
        done = run("describe", CLIP, *args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and phrase in done.stderr, done.stderr
    bad = run("describe", CLIP, "--on-cloud-failure", "maybe")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
