"""The canonical phrases (the label vocabulary, docs/calibrate.md): one table, used by the demo
corpus, the demo tokenizer (each phrase is one token) and the scorers (eval, calibrate)."""

from __future__ import annotations

import difflib

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "gender": ("男声", "女声"),
    "rate": ("语速较慢", "语速适中", "语速较快"),
    "pitch": ("音调偏低", "音调适中", "音调偏高"),
    "volume": ("音量较小", "音量适中", "音量较大"),
    "pauses": ("停顿较少", "停顿较多"),
    "emotion": ("情绪低落", "情绪平静", "情绪激动"),
}

ALL_PHRASES: tuple[str, ...] = tuple(p for phrases in ATTRIBUTES.values() for p in phrases)


def find_phrases(description: str) -> dict[str, list[str]]:
    """Every canonical phrase of each attribute that occurs in `description`."""
    return {attr: [p for p in phrases if p in description] for attr, phrases in ATTRIBUTES.items()}


def predict(description: str) -> dict[str, str | None]:
    """The attribute values a description states: the phrase if exactly one of the attribute's
    phrases occurs, else None (missing or ambiguous)."""
    found = find_phrases(description)
    return {attr: (hits[0] if len(hits) == 1 else None) for attr, hits in found.items()}


def agreement(text: str, reference: str) -> tuple[float, str]:
    """How closely `text` says what `reference` (cloud-only's sentence) says, in [0, 1], and which
    measure was used: "phrases" (share of the reference's stated attributes stated alike) when the
    reference holds canonical phrases, else "chars" (difflib's similarity ratio). The quality of a
    description without labels (calibrate, eval)."""
    ref = {a: v for a, v in predict(reference).items() if v is not None}
    if ref:
        got = predict(text)
        return sum(got[a] == v for a, v in ref.items()) / len(ref), "phrases"
    return difflib.SequenceMatcher(None, text, reference, autojunk=False).ratio(), "chars"
