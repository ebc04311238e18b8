"""What a decoded block says, in words: its gate against the threshold, each draft token's verdict
and the tokens as text. One vocabulary for every view of a decode: the terminal's live view and
trace (commands/ui.py), the trace plot (commands/plots.py) and the web page (webui/), so the
page shows a block as the terminal does. No styling here: each view maps the kinds to its own
colours (Rich styles, CSS classes)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .errors import printable

if TYPE_CHECKING:
    from .decoding.config import DecodingConfig
    from .decoding.loop import BlockEvent

ACCEPTED, REJECTED, DISCARDED, UNVERIFIED = "✓", "✗", "–", "·"
# A draft token's verdict, by kind (what `verdicts` returns), and its mark.
MARKS = {"accepted": ACCEPTED, "rejected": REJECTED, "discarded": DISCARDED, "unverified": UNVERIFIED}
UNIT = "nats"
UNCERTAINTY_LABEL = {"sum": "ΣH", "max": "max H", "mean": "mean H"}
# The meaning gate's block score (decoding/gate.py): the edge's probability mass on alternatives that
# would change what the sentence says, aggregated like the entropies.
MEANING_LABEL = {"sum": "Σm", "max": "max m", "mean": "mean m"}
WHY = {"entropy": "uncertain", "meaning": "unsure of the meaning", "loop": "loop detected", "always": "verify=always"}


def gate_of(event: BlockEvent, cfg: DecodingConfig) -> tuple[str, float, float]:
    """(label, score, limit) of the gate that read the block: the meaning gate's score against
    gate_upload or gate_verify, else the entropy gate's uncertainty against the threshold."""
    if event.gate == "meaning" and event.score is not None and event.limit is not None:
        return MEANING_LABEL[cfg.uncertainty], event.score, event.limit
    return UNCERTAINTY_LABEL[cfg.uncertainty], event.uncertainty, cfg.threshold


def gate_rule(cfg: DecodingConfig, short: bool = False) -> str:
    """The escalation rule in words, for the trace's header (and, `short`, the live view's subtitle)."""
    entropy = f"{UNCERTAINTY_LABEL[cfg.uncertainty]} > {format_threshold(cfg.threshold)}"
    if cfg.verify != "meaning":
        return entropy
    m = MEANING_LABEL[cfg.uncertainty]
    if short:
        return f"{m} > {format_threshold(cfg.gate_upload)} / {format_threshold(cfg.gate_verify)} (up / held)"
    return (f"{m} > {format_threshold(cfg.gate_upload)} (clip not yet up) or {format_threshold(cfg.gate_verify)} "
            f"(cloud holds it); {entropy} without a gate for this task")


def gate_text(event: BlockEvent, cfg: DecodingConfig) -> tuple[str, bool]:
    """The block's gate as the trace writes it ('ΣH 3.22 > 0.642') and whether it was over."""
    label, score, limit = gate_of(event, cfg)
    over = score > limit
    return f"{label} {score:.2f} {'>' if over else '≤'} {format_threshold(limit)}", over


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token as the user should see it: an end-of-turn token as a readable end mark (⟨end⟩), other
    special tokens by their bare name (⟨audio_bos⟩), invisible characters made visible."""
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    special = text.startswith("<|") and text.endswith("|>") and len(text) > 4
    if special and token_id in set(getattr(tokenizer, "all_special_ids", ()) or ()) | _added_ids(tokenizer):
        name = text[2:-2]
        return "⟨end⟩" if name in ("im_end", "endoftext") else f"⟨{name}⟩"
    return printable(text).replace("\\n", "⏎").replace(" ", "␣") or "∅"


def _added_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's added tokens (Qwen's <|im_end|> is one, not always in all_special_ids)."""
    try:
        return set(tokenizer.get_added_vocab().values())
    except Exception:  # a tokenizer without added tokens
        return set()


def format_threshold(threshold: float) -> str:
    return "∞" if math.isinf(threshold) else f"{threshold:g}"


def level(value: float, budget: float) -> str:
    """One token's entropy (or meaning score) against its share of the threshold: "over" it (the
    token that pushes the block to the cloud), "near" (half of it or more), else "under"."""
    if value >= budget:
        return "over"
    return "near" if value >= budget / 2 else "under"


def token_budget(cfg: DecodingConfig, block_len: int, limit: float | None = None) -> float:
    """The per-token entropy (or meaning score, against `limit`) that would put the block at the
    threshold. With `sum` the threshold is shared by the block's tokens; with `max` and `mean` it
    applies to each token as is."""
    limit = cfg.threshold if limit is None else limit
    if cfg.uncertainty == "sum" and block_len:
        return limit / block_len
    return limit


def verdicts(event: BlockEvent) -> list[str]:
    """Each draft token's verdict: "unverified" (kept on the edge, or the cloud failed the block),
    "accepted", the first "rejected", then "discarded"."""
    if not event.escalated or event.fallback is not None:  # the cloud failed it: kept unverified
        return ["unverified"] * len(event.draft)
    return ["accepted" if i < event.accepted else "rejected" if i == event.accepted else "discarded"
            for i in range(len(event.draft))]


def where_it_went(event: BlockEvent) -> tuple[str, str]:
    """(kind, words) of where the block went, as the trace writes it: ("edge", "kept on the edge"),
    ("cloud", "→ cloud (entropy) 1/10") or ("fallback", "→ cloud failed (unreachable), edge")."""
    if event.fallback is not None:
        return "fallback", f"→ cloud failed ({event.fallback}), edge"
    if event.escalated:
        return "cloud", f"→ cloud ({event.reason}) {event.accepted}/{len(event.draft)}"
    return "edge", "kept on the edge"
