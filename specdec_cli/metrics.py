"""Text metrics of a description: punctuation density, repeated n-grams, doubled characters."""

from __future__ import annotations

import unicodedata


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf"


def punct_density(text: str) -> float:
    """Punctuation characters / characters (seed 004: 10–25% is normal, > 40% a flood)."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(unicodedata.category(c).startswith("P") for c in chars) / len(chars)


def repeat_rate(text: str) -> float:
    """Share of CJK content 2- and 3-grams (punctuation stripped) that repeat an earlier one."""
    content = [c for c in text if _is_cjk(c)]
    total = repeated = 0
    for n in (2, 3):
        seen: set[str] = set()
        for i in range(len(content) - n + 1):
            gram = "".join(content[i:i + n])
            total += 1
            repeated += gram in seen
            seen.add(gram)
    return repeated / total if total else 0.0


def immediate_repeats(text: str) -> int:
    """Same CJK character twice in a row."""
    return sum(1 for a, b in zip(text, text[1:], strict=False) if a == b and _is_cjk(a))
