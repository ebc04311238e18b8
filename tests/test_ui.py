"""The Live view and the panels, rendered into a string by a forced-terminal Rich console."""

from __future__ import annotations

import dataclasses
import io
import json
import re

import pytest
from rich.console import Console

from specdec_cli.commands import ui
from specdec_cli.decoding import DecodingConfig
from specdec_cli.decoding.loop import BlockEvent
from specdec_cli.describe import Describer
from specdec_cli.models import ModelPair
from specdec_cli.presets import Preset

pytest_plugins = ["cli_fixtures"]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def console(width: int = 110) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=width, color_system="truecolor"), buf


def plain(text: str) -> str:
    return ANSI.sub("", text)


def ids(tokenizer, text: str) -> list[int]:
    """One id per character (the test tokenizer would also match whole phrases like 女声)."""
    return [tokenizer.convert_tokens_to_ids(ch) for ch in text]


@pytest.fixture
def events(tokenizer):
    """Block 1 kept on the edge; block 2 escalated, one accepted then a recovered token;
    block 3 escalated, all accepted plus a bonus token."""
    a, b, c = ids(tokenizer, "说话人"), ids(tokenizer, "是女声"), ids(tokenizer, "语速")
    e1 = BlockEvent(0, a, [0.40, 0.30, 0.20], 0.90, False, "", accepted=3, answer=a)
    e2 = BlockEvent(1, b, [1.10, 2.60, 2.90], 6.60, True, "entropy", accepted=1, correction=b[1],
                    correction_kind="recovered", cloud_tokens=4, answer=a + b[:2])
    e3 = BlockEvent(2, c, [3.50, 3.00], 6.50, True, "entropy", accepted=2, correction=c[0],
                    correction_kind="bonus", cloud_tokens=3, answer=a + b[:2] + c + c[:1], done=True)
    return [e1, e2, e3]


def test_block_panel_shows_tokens_entropies_marks_and_counts(tokenizer, events):
    cfg = DecodingConfig(threshold=5.75, k=3)
    con, buf = console()
    view = ui.LiveView(con, tokenizer, cfg, title="clip.wav")
    for e in events[:2]:
        view.on_block(e)
    con.print(view.render())
    out = plain(buf.getvalue())
    assert "说话人是女▌" in out                      # the sentence so far
    assert "draft" in out and "是" in out and "女" in out and "声" in out
    assert "1.10" in out and "2.60" in out and "2.90" in out  # per-token entropies
    assert f"{ui.ACCEPTED}" in out and f"{ui.REJECTED}" in out and f"{ui.DISCARDED}" in out
    assert "cloud recovered" in out
    assert "block 2: ΣH 6.60 > 5.75" in out and "→ cloud (uncertain): 1/3 accepted" in out
    assert "threshold ΣH > 5.75" in out            # the threshold is on screen
    assert "cloud calls 1" in out and "acceptance 33% (1/3)" in out and "tok/s" in out


def test_bonus_block_and_running_counts(tokenizer, events):
    con, buf = console()
    view = ui.LiveView(con, tokenizer, DecodingConfig(threshold=5.75, k=3))
    for e in events:
        view.on_block(e)
    con.print(view.render())
    out = plain(buf.getvalue())
    assert "cloud bonus" in out
    assert "cloud calls 2" in out and "acceptance 60% (3/5)" in out and "8 tokens" in out


def test_kept_block_has_unverified_marks(tokenizer, events):
    con, buf = console()
    view = ui.LiveView(con, tokenizer, DecodingConfig(threshold=5.75, k=3))
    view.on_block(events[0])
    con.print(view.render())
    out = plain(buf.getvalue())
    assert "kept on the edge" in out and ui.UNVERIFIED in out
    assert "cloud calls 0" in out and "acceptance –" in out


def test_entropy_colour_is_relative_to_the_threshold():
    cfg = DecodingConfig(threshold=6.0, k=3, uncertainty="sum")
    budget = ui.token_budget(cfg, 3)
    assert budget == 2.0  # the sum threshold is shared by the block's tokens
    assert ui.entropy_style(0.5, budget) == "green"
    assert ui.entropy_style(1.5, budget) == "yellow"
    assert ui.entropy_style(2.5, budget) == "bold red"
    assert ui.token_budget(cfg.with_(uncertainty="max"), 3) == 6.0
    assert ui.entropy_style(5.0, ui.token_budget(cfg.with_(threshold=float("inf")), 3)) == "green"


def test_entropies_are_coloured_in_the_terminal(tokenizer, events):
    con, buf = console()
    view = ui.LiveView(con, tokenizer, DecodingConfig(threshold=5.75, k=3))
    view.on_block(events[1])
    con.print(view.render())
    raw = buf.getvalue()
    assert "\x1b[" in raw  # ANSI colour codes reach the terminal
    assert re.search(r"\x1b\[[0-9;]*31m2\.60|\x1b\[1;31m2\.60", raw)  # over its share: red


def test_live_context_renders_frames(tokenizer, events):
    """The real Live machinery, on a forced terminal: every block is drawn at least once."""
    con, buf = console()
    with ui.LiveView(con, tokenizer, DecodingConfig(threshold=5.75, k=3), title="live") as view:
        for e in events:
            view.on_block(e)
    out = plain(buf.getvalue())
    for n in (1, 2, 3):
        assert f"block {n}:" in out
    assert "cloud calls 2" in out


def test_disabled_view_draws_nothing(tokenizer, events):
    con, buf = console()
    with ui.LiveView(con, tokenizer, DecodingConfig(), enabled=False) as view:
        for e in events:
            view.on_block(e)
    assert buf.getvalue() == ""


def test_live_view_follows_the_real_decoder(tokenizer, processor, edge, cloud, masks, eos_ids):
    """Fed by the engine's own events, the view's cloud-call count matches the engine's counter."""
    pair = ModelPair(edge, cloud, processor, masks, eos_ids, "edge", "cloud")
    from conftest import clip

    cfg = DecodingConfig(max_new_tokens=12, threshold=12.0, k=3)
    con, buf = console()
    with ui.LiveView(con, tokenizer, cfg) as view:
        desc = Describer(pair).run(clip(1), cfg, on_block=view.on_block)
    out = plain(buf.getvalue())
    assert f"cloud calls {desc.result.stats.cloud_calls} " in out
    assert f"{desc.result.stats.tokens} tokens" in out
    last = desc.result.events[-1]
    assert f"block {last.index + 1}:" in out


def test_summary_panel(tokenizer):
    record = {"file": "a.wav", "description": "说话人是女声。", "mode": "spec", "preset": "fluent",
              "threshold": 5.75, "k": 4, "verify": "entropy", "tokens": 9, "drafted_tokens": 12,
              "accepted_tokens": 8, "acceptance_rate": 0.5, "cloud_calls": 3, "cloud_call_rate": 1 / 3,
              "latency_s": 0.42, "tokens_per_s": 21.4, "latency_modelled_s": 0.72}
    con, buf = console()
    con.print(ui.summary_panel(record))
    out = plain(buf.getvalue())
    for text in ("说话人是女声。", "spec (preset fluent)", "3 (0.33 per token)", "50% of verified drafts",
                 "8/12 drafts kept", "0.42 s", "modelled with network: 0.72 s", "21.4"):
        assert text in out


def test_presets_table_names_sources():
    base = {"fluent": Preset("fluent", {"threshold": 5.75, "k": 4}, "configs/fluent.toml", "fewer calls")}
    merged = {"fluent": Preset("fluent", {"threshold": 2.0, "k": 4}, "/m/specdec_presets.toml", "fewer calls"),
              "never": Preset("never", {"threshold": float("inf")}, "/m/specdec_presets.toml")}
    con, buf = console(width=200)
    con.print(ui.presets_table(merged, base))
    out = plain(buf.getvalue())
    assert "(over configs/fluent.toml)" in out and "∞" in out and "never" in out


# -- the trace that stays after decoding ------------------------------------------------------------

def test_trace_keeps_one_line_per_block(tokenizer, events):
    cfg = DecodingConfig(threshold=5.75, k=3)
    con, buf = console(width=140)
    ui.print_trace(con, events, tokenizer, cfg)
    lines = plain(buf.getvalue()).splitlines()
    assert "escalate when ΣH > 5.75" in lines[0] and "k 3" in lines[0]
    rows = [ln for ln in lines if re.match(r"^\s*\d+\s", ln)]
    assert len(rows) == len(events)
    kept, recovered, bonus = rows
    # block 1: every token with its entropy, unverified, under the threshold, kept on the edge
    assert "说 0.40·" in kept and "话 0.30·" in kept and "人 0.20·" in kept
    assert "ΣH 0.90 ≤ 5.75" in kept and "kept on the edge" in kept
    # block 2: one accepted, the first rejected, the rest discarded; the cloud's own token
    assert f"是 1.10{ui.ACCEPTED}" in recovered and f"女 2.60{ui.REJECTED}" in recovered
    assert f"声 2.90{ui.DISCARDED}" in recovered
    assert "+ 女 (recovered)" in recovered and "6.60 > 5.75" in recovered and "→ cloud (entropy) 1/3" in recovered
    # block 3: all accepted plus a bonus token
    assert "+ 语 (bonus)" in bonus and "→ cloud (entropy) 2/2" in bonus
    # the fixed-width parts line up: every block's tokens start in the same column
    assert len({ln.index("│") for ln in rows}) == 1


def test_trace_says_why_a_block_went_to_the_cloud(tokenizer, events):
    loop = dataclasses.replace(events[0], escalated=True, reason="loop", accepted=3)
    always = dataclasses.replace(events[1], reason="always")
    con, buf = console(width=140)
    ui.print_trace(con, [loop, always], tokenizer, DecodingConfig(threshold=5.75, k=3, verify="always"))
    out = plain(buf.getvalue())
    assert "→ cloud (loop)" in out and "→ cloud (always)" in out


def test_trace_marks_a_block_the_cloud_failed_as_kept_unverified(tokenizer, events):
    """--on-cloud-failure edge: the block whose verification failed keeps its whole draft as the
    edge's own; the trace says the cloud failed and marks no token as verified."""
    failed = dataclasses.replace(events[1], accepted=3, correction=None, correction_kind=None, fallback="unreachable")
    con, buf = console(width=140)
    ui.print_trace(con, [events[0], failed], tokenizer, DecodingConfig(threshold=5.75, k=3))
    row = [ln for ln in plain(buf.getvalue()).splitlines() if re.match(r"^\s*2\s", ln)][0]
    assert "→ cloud failed (unreachable), edge" in row and "是 1.10·" in row and "声 2.90·" in row
    assert ui.ACCEPTED not in row and ui.REJECTED not in row and "+ " not in row


def test_trace_entropies_are_coloured_against_the_threshold(tokenizer, events):
    con, buf = console(width=140)
    ui.print_trace(con, events, tokenizer, DecodingConfig(threshold=5.75, k=3))
    raw = buf.getvalue()
    # 2.60 is over its share of the threshold (5.75 / 3): red; 0.40 is well under it: green
    assert re.search(r"\x1b\[[0-9;]*31m 2\.60", raw)
    assert re.search(r"\x1b\[[0-9;]*32m 0\.40", raw)


def _trace_rows(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("trace ·"))
    return [ln for ln in lines[start + 1:] if re.match(r"^\s*\d+\s", ln)]


def test_describe_trace_on_stderr_json_alone_on_stdout(tmp_path, models):
    from cli_helpers import write_clip
    from typer.testing import CliRunner

    from specdec_cli.commands.app import app

    clip = write_clip(tmp_path / "a.wav")
    args = ["describe", str(clip), *models, "--max-new-tokens", "12", "--k", "3", "--threshold", "1.5", "--json"]
    result = CliRunner().invoke(app, [*args, "--trace"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)  # stdout holds exactly one JSON object
    assert result.stdout.count("\n") == 1
    rows = _trace_rows(result.stderr)
    assert rows and sum("→ cloud" in r for r in rows) == record["escalations"]
    assert all(len(r) > 0 and "…" not in r for r in rows)  # whole lines, never cut
    assert "cloud calls" not in result.stderr  # --json: no summary panel (issue 29), the trace only as asked
    with_panel = CliRunner().invoke(app, [a for a in args if a != "--json"] + ["--trace", "--panel"])
    assert with_panel.exit_code == 0, with_panel.stderr
    assert with_panel.stderr.index("trace ·") < with_panel.stderr.index("cloud calls")  # above the summary
    # Not a terminal and no --trace: no trace (a log keeps the summary only)
    plain_run = CliRunner().invoke(app, args)
    assert plain_run.exit_code == 0 and "trace ·" not in plain_run.stderr


def test_special_tokens_in_the_trace_are_readable_marks():
    """Issue 36: the trace never shows a raw <|im_end|>; a control character in a token is escaped."""
    class Tok:
        all_special_ids = [7]

        def get_added_vocab(self):
            return {"<|im_end|>": 7, "<|audio_bos|>": 8}

        def decode(self, ids, skip_special_tokens=False):
            return {7: "<|im_end|>", 8: "<|audio_bos|>", 9: "a\x1bb", 10: "<|not special|>"}[ids[0]]

    assert [ui.token_text(Tok(), i) for i in (7, 8, 9, 10)] == ["⟨end⟩", "⟨audio_bos⟩", "a\\x1bb", "<|not␣special|>"]


def test_link_line_says_the_share_that_never_went_up_without_a_double_negative():
    from specdec_cli.commands.ui import LinkTally

    tally = LinkTally()
    up = {"uplink_bytes": 1000, "downlink_bytes": 10, "round_trips": 2, "cloud_wait_s": 0.5}
    tally.add(up)
    tally.add(up)
    assert tally.line().startswith("cloud link: every one of 2 clips went up · 2.0 kB up")
    tally.add({**up, "uplink_bytes": 0, "downlink_bytes": 0, "round_trips": 0, "cloud_wait_s": 0.0})
    tally.add({"error": "x"})  # a failed clip is not counted
    assert tally.line().startswith("cloud link: 1 of 3 clips (33%) never went up · ")
    assert "4 round trips · 1.00 s waiting on the cloud" in tally.line()


def test_counts_read_as_a_person_says_them():
    """Issue 44: "1 clips"; and a link line saying every clip went up beside a fallback line saying
    most finished on the edge read as a contradiction."""
    from specdec_cli.commands.ui import FallbackTally, LinkTally, clips

    assert (clips(0), clips(1), clips(2)) == ("0 clips", "1 clip", "2 clips")
    record = {"error": None, "uplink_bytes": 1000, "downlink_bytes": 10, "round_trips": 2, "cloud_wait_s": 0.5,
              "fallback": "unreachable"}
    link, fallback = LinkTally(), FallbackTally()
    link.add(record)
    fallback.add(record)
    assert link.line().startswith("cloud link: every one of 1 clip went up (1 then finished on the edge alone) · ")
    assert fallback.line() == "the cloud failed on 1 of 1 clip (unreachable); the edge finished it alone"


def test_a_request_not_waited_for_that_fails_prints_no_warning(caplog):
    """Issue 44: "DELETE … (not waited for) failed" reached stderr through logging's last-resort
    handler; it is a debug line now (no result depends on it)."""
    import concurrent.futures
    import logging

    from specdec_cli.remote.client import RemoteClient

    client = RemoteClient("http://127.0.0.1:9")
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(ConnectionError("refused"))
    with caplog.at_level(logging.DEBUG, logger="specdec.client"):
        client._answered(future, "DELETE", "/v1/sessions/x")
    assert [r.levelno for r in caplog.records if "not waited for" in r.getMessage()] == [logging.DEBUG]


def test_quiet_and_json_draw_no_spinner_while_the_models_load(monkeypatch):
    """Issue 44: --quiet and --json still drew the 'loading models…' spinner on a terminal."""
    from specdec_cli.commands import describe as describe_cmd
    from specdec_cli.pair import Pair

    drawn: list[str] = []

    class Terminal:
        is_terminal = True

        def status(self, text: str):
            import contextlib

            drawn.append(text)
            return contextlib.nullcontext()

    monkeypatch.setattr(Pair, "from_spec", classmethod(lambda cls, spec: "pair"))
    assert describe_cmd.load(None, Terminal(), spinner=False) == "pair" and drawn == []
    assert describe_cmd.load(None, Terminal()) == "pair" and drawn == ["loading models…"]
    # what describe passes for each output mode
    import inspect

    source = inspect.getsource(describe_cmd.describe)
    assert "load(spec, err, spinner=not json_out and not quiet)" in source
