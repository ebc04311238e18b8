"""Plots write PNG files (skipped without matplotlib) and fail with a one-line InputError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specdec_cli.commands.plots import plot_frontier, plot_trace
from specdec_cli.decoding import BlockEvent, DecodingConfig, speculative_decode
from specdec_cli.errors import InputError

PNG = b"\x89PNG\r\n\x1a\n"


def _mode(name: str, rate: float, acc: float) -> dict:
    return {"mode": name, "cloud_call_rate": rate, "mean_accuracy": acc}


REPORT = {
    "modes": [_mode("edge", 0.0, 0.55), _mode("cloud", 0.95, 0.9), _mode("fluent", 0.2, 0.8),
              _mode("always", 0.4, 0.9)],
    "frontier": {"parameter": "threshold", "k": 6, "points": [
        {"threshold": t, "cloud_call_rate": r, "mean_accuracy": a}
        for t, r, a in [(1.0, 0.5, 0.9), (3.0, 0.25, 0.85), (6.0, 0.1, 0.7)]]},
}

EVENTS = [
    BlockEvent(0, [10, 11, 12, 13], [0.1, 0.2, 0.3, 0.1], 0.7, False, "", 4),
    BlockEvent(1, [14, 15, 16, 17], [1.5, 2.0, 0.4, 0.9], 4.8, True, "entropy", 1, correction=20,
               correction_kind="recovered"),
    BlockEvent(2, [18, 19], [0.2, 0.1], 0.3, True, "loop", 2, correction=21, correction_kind="bonus", done=True),
]


@pytest.fixture(autouse=True)
def _needs_matplotlib(request):
    if "no_matplotlib" not in request.node.name:
        pytest.importorskip("matplotlib")


def test_frontier_png(tmp_path):
    out = plot_frontier(REPORT, tmp_path / "sub" / "frontier.png")
    assert out.read_bytes()[:8] == PNG


def test_frontier_without_sweep_plots_the_modes(tmp_path):
    out = plot_frontier({"modes": REPORT["modes"], "frontier": None}, tmp_path / "f.png")
    assert out.read_bytes()[:8] == PNG


def test_frontier_with_nothing_to_plot(tmp_path):
    with pytest.raises(InputError, match="nothing to plot"):
        plot_frontier({"modes": [_mode("edge", None, None)], "frontier": None}, tmp_path / "f.png")


def test_trace_png(tmp_path, tokenizer):
    out = plot_trace(EVENTS, 3.25, tmp_path / "trace.png", tokenizer)
    assert out.read_bytes()[:8] == PNG


def test_trace_of_a_real_decode(tmp_path, edge, cloud, inputs, masks, eos_ids, tokenizer):
    cfg = DecodingConfig(k=3, threshold=1.0, max_new_tokens=12)
    events = speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids).events
    out = plot_trace(events, cfg.threshold, tmp_path / "trace.png", tokenizer)
    assert out.read_bytes()[:8] == PNG


def test_trace_without_threshold_or_tokenizer(tmp_path):
    # threshold = inf (edge-only through the loop) draws no threshold line.
    out = plot_trace(EVENTS, float("inf"), tmp_path / "trace.png")
    assert out.read_bytes()[:8] == PNG


def test_trace_with_no_blocks(tmp_path):
    with pytest.raises(InputError):
        plot_trace([], 3.0, tmp_path / "trace.png")


def test_no_matplotlib_is_a_one_line_input_error(tmp_path, monkeypatch):
    # A None entry in sys.modules makes `import matplotlib` raise ImportError.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(InputError, match=r"pip install 'specdec-omni\[plot\]'") as exc:
        plot_frontier(REPORT, tmp_path / "f.png")
    assert "\n" not in exc.value.message
    assert not (tmp_path / "f.png").exists()


def _drawn(monkeypatch, events, tokenizer):
    """The trace figure's axes, captured where it would be saved."""
    from specdec_cli.commands import plots

    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or Path(path))
    plot_trace(events, 3.25, "unused.png", tokenizer)
    return figs[0].axes[0]


def _ticks(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


def test_trace_names_tokens_when_a_font_has_them(monkeypatch, tokenizer):
    from specdec_cli.commands import plots, ui

    monkeypatch.setattr(plots, "font_for", lambda text: "DejaVu Sans")  # as if a CJK font were installed
    events = [BlockEvent(0, tokenizer.convert_tokens_to_ids(["说", "话"]), [0.1, 2.0], 2.1, True, "entropy", 1,
                         correction=tokenizer.convert_tokens_to_ids("人"), correction_kind="recovered")]
    ax = _drawn(monkeypatch, events, tokenizer)
    assert _ticks(ax) == ["说", "话"] == [ui.token_text(tokenizer, t) for t in events[0].draft]
    assert ax.get_xlabel() == "draft token"
    assert any(t.get_text() == "entropy" for t in ax.texts)  # why the block escalated
    assert "rejected by the cloud" in [h.get_label() for h in ax.collections]  # the rejection is crossed


def test_trace_falls_back_to_ids_with_a_note_without_a_font(monkeypatch, tokenizer):
    from specdec_cli.commands import plots

    monkeypatch.setattr(plots, "font_for", lambda text: None)
    ax = _drawn(monkeypatch, EVENTS, tokenizer)
    assert _ticks(ax) == [str(t) for e in EVENTS for t in e.draft]
    assert plots.NO_FONT_NOTE in ax.get_xlabel()


def test_font_search_checks_glyphs():
    from specdec_cli.commands.plots import font_for

    assert font_for("draft") is not None            # matplotlib always ships DejaVu Sans
    assert font_for("\U0010fffd") is None           # a private-use code point no font draws
    assert "Last Resort" not in str(font_for("说话"))  # it "covers" everything, with boxes
