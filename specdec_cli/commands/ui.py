"""Terminal views: the Live view of one clip's decoding, the summary panel, the batch progress bar.

Everything draws on a Console the caller passes (stderr in the CLI). The Live view consumes only
BlockEvents, plus the tokenizer to turn ids into text: ids become text here, never in the engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from ..blocks import (  # noqa: F401  (re-exported: the views' names, as tests and plots use them)
    ACCEPTED,
    DISCARDED,
    MARKS,
    REJECTED,
    UNIT,
    UNVERIFIED,
    WHY,
    format_threshold,
    gate_of,
    gate_rule,
    gate_text,
    level,
    token_budget,
    token_text,
    verdicts,
    where_it_went,
)
from ..decoding.config import DecodingConfig

if TYPE_CHECKING:
    from ..decoding.loop import BlockEvent
from ..errors import printable
from ..presets import EXTRA_KEYS, GATE_KEYS, PRESET_KEYS, Preset

# prompt.INSTRUCTION is the gate's DEFAULT_INSTRUCTION (a test checks); decoding.gate imports numpy,
# which `specdec --help` must not load (tests/test_fast_imports.py).
from ..prompt import INSTRUCTION as DEFAULT_INSTRUCTION

# The words of a block (its gate, its tokens' verdicts, tokens as text) are blocks.py's, shared with
# the plot and the web page; this module gives them Rich's colours.
_STYLE = {"over": "bold red", "near": "yellow", "under": "green"}
_MARK_STYLE = {"accepted": "bold green", "rejected": "bold red", "discarded": "dim", "unverified": "dim"}
_WHERE_STYLE = {"edge": "green", "cloud": "magenta", "fallback": "yellow"}


def entropy_style(entropy: float, budget: float) -> str:
    """Colour of one token's entropy against its share of the threshold: green well under it,
    yellow approaching it, red over it (the token that pushes the block to the cloud)."""
    return _STYLE[level(entropy, budget)]


def marks(event: BlockEvent) -> list[tuple[str, str]]:
    """(mark, style) per draft token: kept unverified, accepted, the first rejected, discarded."""
    return [(MARKS[kind], _MARK_STYLE[kind]) for kind in verdicts(event)]


@dataclass(frozen=True)
class _Snapshot:
    """What one frame shows. Replaced whole on each event, so Live's refresh thread never reads a
    half-updated view."""

    sentence: str = ""
    event: BlockEvent | None = None
    cloud_calls: int = 0
    verified_drafted: int = 0
    verified_accepted: int = 0
    tokens: int = 0
    tokens_per_s: float | None = None


class LiveView:
    """The Live view of one clip. Use as a context manager; pass `on_block` to the decoder.

    With `enabled=False` (no terminal, --no-live) it draws nothing and `on_block` only counts."""

    def __init__(self, console: Console, tokenizer: Any, cfg: DecodingConfig, title: str = "specdec",
                 enabled: bool = True) -> None:
        self.console, self.tokenizer, self.cfg, self.title = console, tokenizer, cfg, title
        self.enabled = enabled
        self._snap = _Snapshot()
        self._live: Live | None = None
        self._start = time.perf_counter()

    def __enter__(self) -> LiveView:
        self._start = time.perf_counter()
        if self.enabled:
            # transient: the summary panel printed afterwards replaces the view, so the terminal
            # ends with the result, not with the last intermediate frame.
            self._live = Live(self, console=self.console, refresh_per_second=8, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc_info)
            self._live = None

    def on_block(self, event: BlockEvent) -> None:
        s = self._snap
        elapsed = time.perf_counter() - self._start
        verified = event.escalated and event.fallback is None  # a block the cloud failed was not verified
        self._snap = _Snapshot(
            sentence=self.tokenizer.decode(event.answer, skip_special_tokens=True),
            event=event,
            cloud_calls=s.cloud_calls + verified,  # one cloud forward per verified block
            verified_drafted=s.verified_drafted + (len(event.draft) if verified else 0),
            verified_accepted=s.verified_accepted + (event.accepted if verified else 0),
            tokens=len(event.answer),
            tokens_per_s=len(event.answer) / elapsed if elapsed > 0 else None,
        )
        if self._live is not None:
            self._live.refresh()  # draw every block at least once, however fast blocks come

    def __rich__(self) -> RenderableType:
        return self.render()

    def render(self) -> Panel:
        snap = self._snap
        parts: list[RenderableType] = [Text(snap.sentence + "▌", style="bold")]
        if snap.event is None:
            parts.append(Spinner("dots", text=Text(f"listening and decoding ({self.cfg.mode})…", style="dim")))
        else:
            parts += [Text(""), self._block_table(snap.event), self._block_line(snap.event)]
        parts += [Text(""), self._stats_line(snap)]
        return Panel(Group(*parts), title=self.title, subtitle=self._subtitle(), border_style="cyan")

    def _subtitle(self) -> str:
        cfg = self.cfg
        if cfg.mode != "spec":
            return f"mode {cfg.mode}"
        return f"threshold {gate_rule(cfg, short=True)} · k {cfg.k} · verify {cfg.verify}"

    def _block_table(self, event: BlockEvent) -> RenderableType:
        budget = token_budget(self.cfg, len(event.draft))
        tokens = [Text(token_text(self.tokenizer, t)) for t in event.draft]
        entropies = [Text(f"{h:.2f}", style=entropy_style(h, budget)) for h in event.entropies]
        verdicts = [Text(m, style=style) for m, style in marks(event)]
        if event.correction is not None:
            # The cloud's own token: at the first rejection (recovered) or after a fully accepted block (bonus).
            tokens.append(Text(token_text(self.tokenizer, event.correction), style="bold magenta"))
            entropies.append(Text(f"cloud {event.correction_kind}", style="magenta"))
            verdicts.append(Text("+", style="bold magenta"))
        rows = [("draft", tokens), ("H nats", entropies)]
        if event.meaning is not None:
            meaning_budget = token_budget(self.cfg, len(event.draft), event.limit)
            # one cell per drafted token; the cloud's own token (a correction) has no meaning score,
            # so its column stays empty (a short row made FoldedTable index past it: IndexError)
            rows.append(("meaning", [Text(f"{m:.2f}", style=entropy_style(m, meaning_budget))
                                     for m in event.meaning] + [Text("")] * (len(tokens) - len(event.meaning))))
        rows.append(("verdict", verdicts))
        return FoldedTable(rows)

    def _block_line(self, event: BlockEvent) -> Text:
        line = Text(f"block {event.index + 1}: {gate_text(event, self.cfg)[0]}  ")
        if not event.escalated:
            line.append("kept on the edge", style="green")
        elif event.fallback is not None:
            line.append(f"→ cloud failed ({event.fallback}): kept on the edge", style="yellow")
        else:
            why = WHY.get(event.reason, event.reason)
            line.append(f"→ cloud ({why}): {event.accepted}/{len(event.draft)} accepted", style="magenta")
        return line

    @staticmethod
    def _stats_line(snap: _Snapshot) -> Text:
        rate = (f"{snap.verified_accepted / snap.verified_drafted:.0%} ({snap.verified_accepted}/{snap.verified_drafted})"
                if snap.verified_drafted else "–")
        speed = f"{snap.tokens_per_s:.1f}" if snap.tokens_per_s is not None else "–"
        return Text(f"cloud calls {snap.cloud_calls} · acceptance {rate} · {speed} tok/s · {snap.tokens} tokens",
                    style="cyan")


class FoldedTable:
    """Labelled rows of cells in columns (the live view's draft / H nats / verdict), folded onto as
    many tables as the width needs, each with the labels again. A table too wide for its box had
    Rich shrink every column and cut them (`H na…`, `1…`, `cloud recover…`)."""

    def __init__(self, rows: list[tuple[str, list[Text]]]) -> None:
        self.rows = rows

    def _table(self, columns: range) -> Table:
        table = Table(show_header=False, box=None, padding=(0, 1))
        table.add_column(style="dim", no_wrap=True)
        for _ in columns:
            table.add_column(justify="center", no_wrap=True)
        for label, cells in self.rows:
            table.add_row(Text(label), *[cells[i] for i in columns])
        return table

    def __rich_console__(self, console: Console, options: Any) -> Any:
        from rich.cells import cell_len

        # Each column takes its widest cell plus one space of padding either side (padding (0, 1)).
        # Summed here: Rich's own measurement of a table is clamped to the width it is offered.
        label_w = max((cell_len(label) for label, _ in self.rows), default=0) + 2
        n = max((len(cells) for _, cells in self.rows), default=0)
        widths = [max(cell_len(cells[i].plain) for _, cells in self.rows if i < len(cells)) + 2 for i in range(n)]
        start = 0
        while start < n:  # as many columns per table as fit; at least one, however narrow
            end, used = start + 1, label_w + widths[start]
            while end < n and used + widths[end] <= options.max_width:
                used += widths[end]
                end += 1
            yield self._table(range(start, end))
            start = end


def trace_lines(events: Sequence[BlockEvent], tokenizer: Any, cfg: DecodingConfig,
                width: int | None = None) -> list[Text]:
    """The whole decode, one line per block, to stay on screen above the summary (the Live view is
    transient and a demo-pair decode is over in a tenth of a second). A header, then per block: its
    uncertainty against the threshold; where it went (kept on the edge, or to the cloud and why:
    entropy, loop, always, with how many draft tokens the cloud kept); each draft token with its
    entropy, coloured against the block's share of the threshold, and its verdict; the cloud's
    recovered or bonus token. The fixed-width parts come first, aligned; the tokens last.

    `width` None: each block is one line however long (a log keeps it whole, for grep). A width: a
    block's tokens that do not fit go on lines of their own under its first token, after a `│`, so
    the block wraps as a unit and a token and its entropy are never split (a terminal folding a
    190-column line cut them anywhere)."""
    gates, wheres = [], []
    for e in events:
        gate, over = gate_text(e, cfg)
        gates.append((gate, "red" if over else "green"))
        kind, words = where_it_went(e)
        wheres.append((words, _WHERE_STYLE[kind]))
    width_g = max((len(g) for g, _ in gates), default=0)
    width_v = max((len(v) for v, _ in wheres), default=0)
    scores = f"entropy ({UNIT})" + (" / meaning score" if any(e.meaning is not None for e in events) else "")
    out = [Text(f"trace · escalate when {gate_rule(cfg)} · k {cfg.k} · verify {cfg.verify} · "
                f"draft tokens: {scores} and {ACCEPTED} accepted {REJECTED} rejected {DISCARDED} discarded "
                f"{UNVERIFIED} unverified", style="bold")]
    for e, (gate, g_style), (verdict, v_style) in zip(events, gates, wheres, strict=True):
        line = Text(f"{e.index + 1:>3}  ", style="dim")
        line.append(gate.ljust(width_g), style=g_style).append("  ")
        line.append(verdict.ljust(width_v), style=v_style).append("  │ ", style="dim")
        out += _block_lines(line, _token_items(e, tokenizer, cfg), width)
    return out


def _token_items(e: BlockEvent, tokenizer: Any, cfg: DecodingConfig) -> list[Text]:
    """One block's draft tokens, each with its entropy (and meaning score) and verdict, then the
    cloud's own token: the units the trace never splits."""
    budget = token_budget(cfg, len(e.draft))
    meaning = e.meaning if e.meaning is not None else [None] * len(e.draft)
    meaning_budget = token_budget(cfg, len(e.draft), e.limit)
    items = []
    for tok, h, m, (mark, style) in zip(e.draft, e.entropies, meaning, marks(e), strict=True):
        item = Text(token_text(tokenizer, tok), style="bold")
        item.append(f" {h:.2f}", style=entropy_style(h, budget))
        if m is not None:  # the meaning gate's per-token score beside the entropy
            item.append(f"/{m:.2f}", style=entropy_style(m, meaning_budget))
        items.append(item.append(mark, style=style))
    if e.correction is not None:
        items.append(Text(f"+ {token_text(tokenizer, e.correction)} ({e.correction_kind})", style="bold magenta"))
    return items


# Fewer columns than this left beside a block's head: its tokens start on the next line instead.
_MIN_TOKEN_COLUMNS = 16


def _block_lines(head: Text, items: list[Text], width: int | None) -> list[Text]:
    """A block's head and its token items, two spaces apart: one line, or with `width` as many as
    it takes, each continuation indented to the head's `│`."""
    from rich.cells import cell_len

    lines = [head.copy()]
    if width is None:
        for n, item in enumerate(items):
            lines[0].append("  " if n else "").append_text(item)
        return lines
    head_w = cell_len(head.plain)
    narrow = width - head_w < _MIN_TOKEN_COLUMNS
    indent = "    │ " if narrow else " " * (head_w - 2) + "│ "
    if narrow:  # too little room beside the head: every token on the lines under it
        lines[0].rstrip()
        lines.append(Text(indent, style="dim"))
    used, fresh = cell_len(lines[-1].plain), True  # fresh: no item on this line yet
    for item in items:
        item_w = cell_len(item.plain)
        gap = 0 if fresh else 2
        if not fresh and used + gap + item_w > width:
            lines.append(Text(indent, style="dim"))
            used, gap = cell_len(indent), 0
        lines[-1].append(" " * gap).append_text(item)
        used += gap + item_w
        fresh = False
    return lines


def print_trace(console: Console, events: Sequence[BlockEvent], tokenizer: Any, cfg: DecodingConfig) -> None:
    """The trace. On a terminal each block wraps as a unit at the console's width (trace_lines);
    off one (a console that soft-wraps, ui.console) each block is one physical line, never cut
    with an ellipsis, so a log keeps it whole."""
    wrap = not console.soft_wrap
    for line in trace_lines(events, tokenizer, cfg, width=console.width if wrap else None):
        console.print(line, soft_wrap=not wrap)


def _fmt(value: Any, spec: str = ".3f", suffix: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:{spec}}{suffix}"
    return f"{value}{suffix}"


def summary_panel(record: dict[str, Any]) -> Panel:
    """The result of one clip, from its record (the same dict --json prints)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    # fold: a CJK sentence has no spaces to wrap at; Rich folds it at cell widths (2 per CJK character),
    # so the panel never cuts the description.
    grid.add_row("description", Text(record.get("description") or "", style="bold", overflow="fold"))
    mode = record["mode"] + (f" (preset {record['preset']})" if record.get("preset") and record["mode"] == "spec" else "")
    grid.add_row("mode", mode)
    if record["mode"] == "spec":
        grid.add_row("threshold · k · verify", f"{record['threshold']} · {record['k']} · {record['verify']}")
        settings = record.get("settings") or {}
        if record["verify"] == "meaning":
            gate = (f"upload {settings.get('gate_upload')} · verify {settings.get('gate_verify')}"
                    if settings.get("gate") else "none fitted for this pair: the entropy gate")
            grid.add_row("meaning gate", gate)
    if record.get("cloud_free") and record["mode"] == "spec":
        grid.add_row("cloud", Text("never reached: every block stayed on the edge", style="green"))
    grid.add_row("tokens", _fmt(record.get("tokens")))
    grid.add_row("cloud calls", f"{_fmt(record.get('cloud_calls'))} ({_fmt(record.get('cloud_call_rate'), '.2f')} per token)")
    if record["mode"] == "spec":
        grid.add_row("acceptance", f"{_fmt(record.get('acceptance_rate'), '.0%')} of verified drafts · "
                                   f"{_fmt(record.get('accepted_tokens'))}/{_fmt(record.get('drafted_tokens'))} "
                                   "drafts kept overall")
    latency = _fmt(record.get("latency_s"), ".2f", " s")
    if record.get("latency_modelled_s") is not None:
        latency += f"  (modelled with network: {_fmt(record['latency_modelled_s'], '.2f', ' s')})"
    grid.add_row("latency", latency)
    grid.add_row("tokens/s", _fmt(record.get("tokens_per_s"), ".1f"))
    if record.get("cloud_url"):
        grid.add_row("cloud link", f"{record['round_trips']} trips · "
                                   f"{_size(record['uplink_bytes'])} up · {_size(record['downlink_bytes'])} down · "
                                   f"{record['cloud_wait_s']:.2f} s wait")
    if record.get("fallback"):
        grid.add_row("cloud failed", f"{record['fallback']}: the edge went on alone after "
                                     f"{record['fallback_at_tokens']} tokens")
    where = f" · {record['start_s']:.2f}–{record['end_s']:.2f} s" if record.get("segment") is not None else ""
    return Panel(grid, title=f"specdec · {record['file']}{where}", border_style="green")


class RateColumn(ProgressColumn):
    """How many `unit` a second the task goes at (Rich's own speed estimate, over its recent steps)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Any) -> Text:
        return Text(f"{task.speed:.2f} {self.unit}/s" if task.speed else f"– {self.unit}/s", style="cyan")


def batch_progress(console: Console, disable: bool = False, rate_unit: str | None = None) -> Progress:
    """A progress bar with ETA (and, given `rate_unit`, the rate: rows/s). Disabled off a terminal,
    where a bar would only litter logs."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *([RateColumn(rate_unit)] if rate_unit else []),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=disable,
    )


def batch_summary(ok: int, failed: int, skipped: int, out: str) -> Text:
    text = Text("batch: ")
    text.append(f"{ok} ok", style="green")
    text.append(" · ")
    text.append(f"{failed} failed", style="bold red" if failed else "dim")
    text.append(f" · {skipped} skipped (already recorded) → {out}")
    return text


class LinkTally:
    """What a batch sent to a remote cloud, from its records (`--cloud URL` runs only)."""

    def __init__(self) -> None:
        self.clips = self.silent = self.unanswered = self.up = self.down = self.trips = 0
        self.wait_s = 0.0
        self.fell_back = 0

    def add(self, record: dict) -> None:
        if record.get("error") is not None or "uplink_bytes" not in record:
            return
        # From what happened (issue 52): a clip went up when the cloud answered it; one whose every
        # request failed (a dead cloud) tried, and is counted apart from one that never needed it.
        self.clips += 1
        answered = record["downlink_bytes"] > 0
        self.silent += not answered and record["round_trips"] == 0
        self.unanswered += not answered and record["round_trips"] > 0
        self.up += record["uplink_bytes"]
        self.down += record["downlink_bytes"]
        self.trips += record["round_trips"]
        self.wait_s += record["cloud_wait_s"]
        self.fell_back += record.get("fallback") is not None

    def line(self) -> str:
        # Said as CloudFreeTally says it: "0 of 9 clips sent nothing (0%)" read as a double negative.
        went = self.clips - self.silent - self.unanswered
        if self.unanswered:
            kept = f"{went} of {clips(self.clips)} went up, {self.unanswered} never reached the cloud"
            kept += f", {self.silent} never needed it" if self.silent else ""
        else:
            kept = (f"every one of {clips(self.clips)} went up" if not self.silent else
                    f"{self.silent} of {clips(self.clips)} ({self.silent / self.clips:.0%}) never went up")
        if self.fell_back:  # "every one went up" beside "30 finished on the edge" read as a contradiction
            kept += (f" ({self.fell_back} then finished on the edge alone)" if not self.unanswered else
                     f" ({self.fell_back} finished on the edge alone)")
        sent = "up or tried" if self.unanswered else "up"  # a request that never got through is counted too
        return (f"cloud link: {kept} · {_size(self.up)} {sent} · {_size(self.down)} down · {self.trips} round trips · "
                f"{self.wait_s:.2f} s waiting on the cloud")


class CloudFreeTally:
    """How many of a batch's speculative clips never reached the cloud (records' `cloud_free`),
    for in-process runs (a remote run's link line says it as clips that sent nothing)."""

    def __init__(self) -> None:
        self.clips = self.free = 0

    def add(self, record: dict) -> None:
        if record.get("error") is not None or record.get("mode") != "spec" or "cloud_free" not in record:
            return
        self.clips += 1
        self.free += bool(record["cloud_free"])

    def line(self) -> str:
        if not self.free:  # "no cloud: 0 of 12 clips never reached the cloud" read as a double negative
            return f"cloud-free: none of {clips(self.clips)}; every one reached the cloud"
        return (f"cloud-free: {self.free} of {clips(self.clips)} ({self.free / self.clips:.0%}) never reached the "
                "cloud")


def clips(n: int) -> str:
    """"1 clip", "2 clips": a count as a person says it (inputs.clips)."""
    from ..inputs import clips as count

    return count(n)


def names_of(files: Sequence[str], shown: int = 3) -> str:
    """The first few file names (printable), and how many more."""
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return ", ".join(printable(f) for f in files[:shown]) + more


def failure_advice(kinds: dict[str, int], to_stdout: bool = False) -> str:
    """What to do about a batch's failed records, by their `error_kind`: a rerun only for those it may
    help; for the others, what would ("; …" parts to end the batch's error line)."""
    from ..errors import RETRYABLE

    def n(count: int, one: str, many: str) -> str:
        return f"{count} {one if count == 1 else many}"

    retry, too_long, bad = kinds.get(RETRYABLE, 0), kinds.get("too_long", 0), kinds.get("input", 0)
    parts = []
    if too_long:
        other = " (and another --out)" if not to_stdout else ""
        parts.append(f"{n(too_long, 'is', 'are')} longer than the model takes: add --segment{other} to describe "
                     f"{'it' if too_long == 1 else 'them'} in segments")
    if bad:
        parts.append(f"{n(bad, 'cannot be described as it is', 'cannot be described as they are')}: fix or "
                     f"remove {'it' if bad == 1 else 'them'} (a rerun fails {'it' if bad == 1 else 'them'} again)")
    if retry:
        parts.append("rerun to retry them" if not (too_long or bad) else f"rerun to retry the {retry} that may succeed")
    return "".join(f"; {p}" for p in parts)


def fallback_note(label: str, record: dict) -> str:
    """The first clip of a run that the edge finished alone because its cloud failed (the record's
    fallback): what failed and what was done, said once; later ones are counted (FallbackTally)."""
    return (f"note: {label}: the cloud failed ({record['fallback']}): {record['fallback_error']} — the edge finished "
            f"this clip alone after {record['fallback_at_tokens']} tokens "
            f"({record['fallback_verified_tokens']} checked by the cloud), as it will any other the cloud fails "
            "(--on-cloud-failure edge); they are counted at the end")


class FallbackTally:
    """How many of a run's clips (or segments) the edge finished alone because the cloud failed
    (records' `fallback`), by failure. `note` gives the line that explains a failure the first time
    it happens (once per kind of failure), so a run where the cloud dies says it once, not once per
    clip; `line` is the one summary at the end."""

    def __init__(self, unit: str = "clips") -> None:
        self.clips = 0
        self.unit = unit
        self.failures: dict[str, int] = {}
        self.explained: set[str] = set()

    def add(self, record: dict) -> None:
        if record.get("error") is not None or "fallback" not in record:
            return
        self.clips += 1
        if record["fallback"] is not None:
            self.failures[record["fallback"]] = self.failures.get(record["fallback"], 0) + 1

    def note(self, label: str, record: dict) -> str | None:
        """The note for this record when it is the first to fall back for its reason, else None."""
        why = record.get("fallback")
        if record.get("error") is not None or why is None or why in self.explained:
            return None
        self.explained.add(why)
        return fallback_note(label, record)

    @property
    def fell_back(self) -> int:
        return sum(self.failures.values())

    def line(self) -> str:
        """'the cloud failed on 23 of 23 clips (unreachable); the edge finished them alone'."""
        if len(self.failures) == 1:
            why = next(iter(self.failures))
        else:
            why = ", ".join(f"{n} {word}" for word, n in sorted(self.failures.items()))
        unit = self.unit if self.clips != 1 else self.unit.removesuffix("s")
        them = "it" if self.fell_back == 1 else "them"
        return f"the cloud failed on {self.fell_back} of {self.clips} {unit} ({why}); the edge finished {them} alone"


class BandLimitedTally:
    """How many of a run's clips (or segments) are band-limited (records' `band_limited`: nearly
    nothing above 4 kHz, as on a telephone line), and how many were recorded below the models' rate
    (pair.LowSampleRate, counted by `low_rate_counted`), said once at the end of the run (`line`),
    not once per clip."""

    def __init__(self, unit: str = "clips") -> None:
        self.unit = unit
        self.clips = self.limited = self.low_rate = 0
        self.first: str | None = None  # the first band-limited clip's file (a run of one names it)

    def add(self, record: dict) -> None:
        if record.get("error") is not None or "band_limited" not in record:
            return
        self.clips += 1
        if record["band_limited"]:
            self.limited += 1
            self.first = self.first or record.get("file")

    def line(self) -> str | None:
        """The run's note, or None when no clip was band-limited or below the models' rate."""
        if not self.limited and not self.low_rate:
            return None
        unit = self.unit if self.clips != 1 else self.unit.removesuffix("s")
        upsampled = (f"{self.low_rate} {'was' if self.low_rate == 1 else 'were'} recorded below the models' rate "
                     "and upsampled, which adds no detail")
        if not self.limited:
            return f"note: of {self.clips} {unit}, {upsampled}"
        if self.clips == 1:
            which, records = f"{printable(self.first or 'the clip')} is", "its record"
        else:
            which = f"{self.limited} of {self.clips} {unit} {'is' if self.limited == 1 else 'are'}"
            records = "its record" if self.limited == 1 else "their records"
        line = (f"note: {which} band-limited (nearly nothing above 4 kHz, as on a telephone line; band_limited: "
                f"true in {records}): the models may mishear such voices (the demo pair, trained through "
                "telephone lines, still states their pitch less well)")
        return line + (f"; {upsampled}" if self.low_rate else "")


@contextmanager
def low_rate_counted(tally: BandLimitedTally) -> Iterator[None]:
    """While a run of many clips decodes: the library's warning for a clip below the models' rate
    (pair.LowSampleRate, one per clip) is counted into `tally`, not printed, so that the run says
    it once at its end (BandLimitedTally.line). Other warnings print as before."""
    import warnings

    from ..pair import LowSampleRate

    with warnings.catch_warnings():  # puts the filters and showwarning back after
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, LowSampleRate):
                tally.low_rate += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.simplefilter("always", LowSampleRate)  # each clip's, not the first of each message
        warnings.showwarning = show
        yield


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB"):
        if n < 1000 or unit == "MB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def presets_table(presets: dict[str, Preset], base: dict[str, Preset]) -> RenderableType:
    """Presets with their values and where they come from, then what each is for. `base` holds the
    presets of configs/ alone, to say when a model folder's file overrides one of them."""
    return _PresetsView(presets, base)


class _PresetsView:
    """The presets table with a source column where the paths fit whole; on a narrower console the
    sources go under the table, one line each, wrapped at spaces: a path folded in a column broke
    mid-word (`specdec_cli/demo/models/e` + `dge/…`) and could not be copied."""

    def __init__(self, presets: dict[str, Preset], base: dict[str, Preset]) -> None:
        self.presets, self.base = presets, base

    def _table(self, with_source: bool) -> Table:
        table = Table(title="specdec presets", title_style="bold")
        table.add_column("preset", style="bold", no_wrap=True)
        for key in PRESET_KEYS:
            table.add_column(key, justify="right" if key in ("threshold", "k") else "left", no_wrap=True)
        if with_source:
            table.add_column("source", overflow="fold")
        for name in sorted(self.presets):
            p = self.presets[name]
            cells = []
            for key in PRESET_KEYS:
                value = p.values.get(key)
                cells.append("–" if value is None else format_threshold(value) if key == "threshold" else str(value))
            # A presets file is the user's (or a downloaded model folder's) text: printed escaped, so an
            # ESC or newline in a name or description cannot drive the terminal or fake a line.
            source = [printable(_source(p, self.base.get(name)))] if with_source else []
            table.add_row(printable(name), *cells, *source)
        return table

    def __rich_console__(self, console: Console, options: Any) -> Any:
        from rich.measure import Measurement

        table = self._table(with_source=True)
        # The table's natural width, measured unclamped (a measurement is capped at the width offered).
        if Measurement.get(console, options.update_width(10_000), table).maximum <= options.max_width:
            yield table
        else:
            yield self._table(with_source=False)
            sources = Text()
            for name in sorted(self.presets):
                sources.append(printable(name), style="bold").append(
                    f" from {printable(_source(self.presets[name], self.base.get(name)))}\n", style="dim")
            sources.rstrip()
            yield sources
        notes = Text()
        for name in sorted(self.presets):
            p = self.presets[name]
            extra = ", ".join(f"{key} = {p.values[key]!r}" for key in GATE_KEYS + EXTRA_KEYS if key in p.values)
            if p.description or extra:
                about = printable(' · '.join(filter(None, (p.description, extra))))
                notes.append(printable(name), style="bold").append(f": {about}\n", style="dim")
        notes.rstrip()
        if notes:
            yield notes


def gate_line(gate: Any, source: str) -> Text:
    """What `specdec presets` says about the meaning gate the verify = "meaning" presets read."""
    task = "the default task" if gate.instruction == DEFAULT_INSTRUCTION else f"the instruction {gate.instruction!r}"
    text = Text("meaning gate", style="bold")
    return text.append(f": [gate] from {source} · {len(gate.weights)} token weights (others {gate.default:g}) · "
                       f"fitted on {task}, tokenizer {gate.tokenizer or 'not recorded'}; another task or tokenizer "
                       "uses the entropy gate (threshold)", style="dim")


def _source(preset: Preset, base: Preset | None) -> str:
    if base is not None and base.source != preset.source:
        return f"{preset.source} (over {base.source})"
    return preset.source


def console(stderr: bool = True) -> Console:
    """A console for our lines: off a terminal, a line is never wrapped (a log keeps each message,
    path and all, on one line) and nothing is highlighted."""
    out = Console(stderr=stderr, highlight=False)
    out.soft_wrap = not out.is_terminal
    return out


# Off a terminal a batch prints a progress line at most this often (seconds): a log of a long run
# says how far it got without one line per clip. SPECDEC_PROGRESS_S overrides it.
PROGRESS_EVERY_S = 10.0


class ProgressLines:
    """The batch progress for a log: one plain line at the first finished clip, then at most one
    per `every_s` seconds, each saying how far the run is and how long the rest may take."""

    def __init__(self, console: Console, total: int, skipped: int, every_s: float | None = None,
                 unit: str = "clips", skipped_unit: str = "", rate: bool = False) -> None:
        import os

        if every_s is None:
            try:
                every_s = float(os.environ.get("SPECDEC_PROGRESS_S", PROGRESS_EVERY_S))
            except ValueError:
                every_s = PROGRESS_EVERY_S
        self.console, self.total, self.skipped, self.every_s = console, total, skipped, every_s
        self.unit = unit  # what `total` counts; `skipped_unit`: what `skipped` counts, when not that
        self.skipped_unit = f"{skipped_unit} " if skipped_unit and skipped_unit != unit else ""
        self.rate = rate  # say the rate too (rows/s)
        self.done = self.failed = 0
        self.start = time.monotonic()
        self.last: float | None = None

    def advance(self, failed: bool) -> None:
        self.done += 1
        self.failed += failed
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every_s and self.done < self.total:
            return
        self.last = now
        elapsed = now - self.start
        left = elapsed / self.done * (self.total - self.done)
        rate = f"{self.done / elapsed:.2f} {self.unit}/s, " if self.rate and elapsed > 0 else ""
        self.console.print(f"batch: {self.done}/{self.total} {self.unit} ({self.failed} failed"
                           f"{f', {self.skipped} {self.skipped_unit}already recorded' if self.skipped else ''}), "
                           f"{rate}{elapsed:.0f} s elapsed, about {left:.0f} s left", markup=False, soft_wrap=True)
