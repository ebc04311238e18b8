"""Plots: the cost-quality frontier of an eval report, and one clip's decoding trace.

matplotlib is an optional extra (`pip install 'specdec-omni[plot]'`), imported only when a plot is
asked for; a missing install becomes a one-line InputError. Figures are drawn on the Agg canvas
directly (no pyplot), so plotting never touches a global backend or opens a window.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..decoding import BlockEvent
from ..errors import InputError

# Fonts with CJK glyphs, in order of preference; the first installed one labels the tokens.
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Zen Hei",
             "WenQuanYi Micro Hei", "SimHei", "Microsoft YaHei", "PingFang SC", "Heiti SC")


def require_matplotlib() -> None:
    """InputError (one line, with the fix) when matplotlib is not installed. Commands call this
    before decoding, so a missing extra fails in a second, not after the run."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError("plotting needs matplotlib: pip install 'specdec-omni[plot]'") from None


def _figure(width: float, height: float):
    """A Figure on an Agg canvas."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, bbox_inches="tight")  # keeps a legend placed outside the axes
    except OSError as exc:
        raise InputError(f"cannot write the plot {path}: {exc.strerror or exc}") from exc
    return path


@lru_cache(maxsize=8)
def font_for(text: str) -> str | None:
    """An installed font (matplotlib's font manager) with a glyph for every character of `text`:
    the preferred CJK fonts first, then any other. None when no installed font covers it."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    chars = {ord(c) for c in text if not c.isspace()}
    entries = sorted(font_manager.fontManager.ttflist,
                     key=lambda f: CJK_FONTS.index(f.name) if f.name in CJK_FONTS else len(CJK_FONTS))
    for entry in entries:
        if entry.name.startswith("Last Resort"):
            continue  # has a "glyph" for every code point: a box naming its Unicode block, not the character
        try:
            font = FT2Font(entry.fname)
        except (OSError, RuntimeError):  # a broken or unsupported font file: try the next
            continue
        if all(font.get_char_index(c) for c in chars):
            return entry.name
    return None


def _cjk_font() -> str | None:
    return font_for("说话人声音")


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def plot_frontier(report: dict[str, Any], path: str | Path) -> Path:
    """Cloud calls per output token (cost) against mean attribute accuracy (quality): the sweep's
    thresholds as a line, edge-only and cloud-only as baseline points, the other named modes as
    reference points. Without a sweep in the report, only the named modes are drawn."""
    fr = report.get("frontier") or {}
    points = [p for p in fr.get("points", []) if _num(p["cloud_call_rate"]) is not None
              and _num(p["mean_accuracy"]) is not None]
    named = {s["mode"]: s for s in report.get("modes", [])
             if _num(s["cloud_call_rate"]) is not None and _num(s["mean_accuracy"]) is not None}
    if not points and not named:
        raise InputError("nothing to plot: the report has no mode with both cloud calls and accuracy")

    fig = _figure(6.4, 4.4)
    ax = fig.add_subplot()
    if points:
        xs = [p["cloud_call_rate"] for p in points]
        ys = [p["mean_accuracy"] for p in points]
        ax.plot(xs, ys, "o-", color="tab:blue", label=f"speculative, threshold sweep (k = {fr.get('k')})")
        for p in points:
            ax.annotate(f"{p['threshold']:g}", (p["cloud_call_rate"], p["mean_accuracy"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=7, color="tab:blue")
    styles = {"edge": ("s", "tab:green", "edge-only"), "cloud": ("D", "tab:red", "cloud-only"),
              "fluent": ("^", "tab:orange", "spec fluent"), "quality": ("v", "tab:purple", "spec quality"),
              "always": ("P", "tab:brown", "spec verify=always")}
    for name, s in named.items():
        marker, color, label = styles.get(name, ("^", "tab:purple", f"spec {name}"))
        ax.scatter([s["cloud_call_rate"]], [s["mean_accuracy"]], marker=marker, color=color, s=50,
                   zorder=3, label=label)
    ax.set_xlabel("cloud calls per output token")
    ax.set_ylabel("mean attribute accuracy")
    # Zoom on the accuracies we have (a 0–1 axis squeezes a 90–99% frontier into a line).
    all_y = [p["mean_accuracy"] for p in points] + [s["mean_accuracy"] for s in named.values()]
    ax.set_ylim(max(0.0, min(all_y) - 0.03), min(1.0, max(all_y)) + 0.015)
    ax.set_xlim(left=-0.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title("cost–quality frontier")
    fig.tight_layout()
    return _save(fig, path)


NO_FONT_NOTE = "token ids shown: no installed font has these characters (e.g. apt install fonts-noto-cjk)"


def _token_labels(events: Sequence[BlockEvent], tokenizer) -> tuple[list[str], str | None, str | None]:
    """The x axis labels: each draft token's text and the font that draws it; without a tokenizer,
    or when no installed font has its characters (boxes of missing glyphs say less than a number),
    the token ids, with a note saying why."""
    ids = [t for e in events for t in e.draft]
    if tokenizer is None:
        return [str(t) for t in ids], None, None
    from ..blocks import token_text  # specials by name, newlines and spaces made visible

    texts = [token_text(tokenizer, t) for t in ids]
    font = font_for("".join(sorted(set("".join(texts)))))
    if font is None:
        return [str(t) for t in ids], None, NO_FONT_NOTE
    return texts, font, None


def plot_trace(events: Sequence[BlockEvent], threshold: float, path: str | Path, tokenizer=None) -> Path:
    """One clip's decoding: the edge's entropy at every draft token (bars), each block's
    uncertainty (the quantity the gate compares, as a step over the block's tokens) against the
    threshold (dashed), escalated blocks shaded, and draft tokens the cloud rejected crossed out.
    Blocks the meaning gate read (verify=meaning) also show its per-token scores (diamonds), the
    block's score (a purple step) and the limit it was compared with (dashed purple: gate_upload
    until the cloud holds the clip, then gate_verify); `threshold` is then the entropy gate's,
    drawn only where that gate read a block. With a tokenizer (and a CJK font installed) the x axis
    names the tokens."""
    if not events:
        raise InputError("nothing to plot: the trace has no blocks")
    fig = _figure(max(6.4, 0.18 * sum(len(e.draft) for e in events) + 2), 4.0)
    ax = fig.add_subplot()
    x = 0
    first = {"escalated": True, "rejected": True, "block": True, "meaning": True, "score": True, "limit": True}
    for e in events:
        n = len(e.draft)
        xs = list(range(x, x + n))
        if e.escalated:
            ax.axvspan(x - 0.5, x + n - 0.5, color="tab:orange", alpha=0.15, lw=0,
                       label="escalated to the cloud" if first.pop("escalated", False) else None)
            # Why it escalated (entropy / loop / always), at the top of the block, in axes height.
            ax.text(x + (n - 1) / 2, 0.98, e.reason, transform=ax.get_xaxis_transform(), ha="center",
                    va="top", fontsize=7, color="tab:orange")
        kept = [i < e.accepted for i in range(n)]
        ax.bar(xs, e.entropies, width=0.8, color=["tab:blue" if k else "lightgray" for k in kept])
        rejected = [xi for xi, k in zip(xs, kept, strict=True) if not k]
        if rejected:
            ax.scatter(rejected, [e.entropies[xi - x] for xi in rejected], marker="x", color="tab:red",
                       zorder=3, label="rejected by the cloud" if first.pop("rejected", False) else None)
        ax.hlines(e.uncertainty, x - 0.5, x + n - 0.5, color="black", lw=1,
                  label="block uncertainty" if first.pop("block", False) else None)
        if e.gate == "meaning" and e.meaning is not None and e.score is not None and e.limit is not None:
            ax.scatter(xs, e.meaning, marker="D", s=10, color="tab:purple", zorder=3,
                       label="meaning score per token" if first.pop("meaning", False) else None)
            ax.hlines(e.score, x - 0.5, x + n - 0.5, color="tab:purple", lw=1.5,
                      label="block meaning score" if first.pop("score", False) else None)
            if math.isfinite(e.limit):
                ax.hlines(e.limit, x - 0.5, x + n - 0.5, color="tab:purple", ls="--", lw=1,
                          label="meaning gate's limit" if first.pop("limit", False) else None)
        x += n
    entropy_gated = any(e.gate != "meaning" for e in events)
    if math.isfinite(threshold) and entropy_gated:
        ax.axhline(threshold, color="tab:red", ls="--", lw=1, label=f"threshold {threshold:g}")
    labels, font, note = _token_labels(events, tokenizer)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7 if len(labels) <= 60 else 5, fontfamily=font,
                       rotation=0 if font is not None else 90)
    ax.set_xlim(-1, x)
    ax.set_xlabel("draft token" + (f" ({note})" if note else "" if font is not None else " id"))
    meaning = not entropy_gated or any(e.gate == "meaning" for e in events)
    ax.set_ylabel("nats · meaning score" if meaning else "nats")
    ax.set_title("edge entropy and meaning score per draft token" if meaning else "edge entropy per draft token")
    limits = [e.limit for e in events if e.gate == "meaning" and e.limit is not None and math.isfinite(e.limit)]
    ax.set_ylim(0, max(max(e.uncertainty for e in events), max(max(e.entropies, default=0) for e in events),
                       threshold if math.isfinite(threshold) and entropy_gated else 0,
                       max((e.score or 0.0 for e in events), default=0), max(limits, default=0)) * 1.15 + 0.1)
    # Below the axes, so it never hides a block.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False)
    with warnings.catch_warnings():
        # Glyph warnings for rare tokens the chosen font lacks: the plot is still useful.
        warnings.filterwarnings("ignore", message="Glyph .* missing")
        fig.tight_layout()
        return _save(fig, path)
