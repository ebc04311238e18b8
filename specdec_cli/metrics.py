"""Text metrics of a description and the result record of ../shared/docs/demo-spec.md."""

from __future__ import annotations

import math
import unicodedata
from typing import TYPE_CHECKING, Any

from .decoding.config import DecodingConfig

if TYPE_CHECKING:
    from .decoding.loop import DecodeResult

RECORD_FIELDS = (
    "file", "description", "mode", "preset", "threshold", "k", "verify", "tokens", "drafted_tokens",
    "accepted_tokens", "acceptance_rate", "cloud_calls", "cloud_call_rate", "cloud_tokens",
    "punct_density", "repeat_rate", "latency_s", "error",
)


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


def build_record(file: str, text: str | None, result: DecodeResult | None, cfg: DecodingConfig,
                 preset: str | None, latency_s: float | None, error: str | None = None,
                 **extra: Any) -> dict[str, Any]:
    """One result record (the --json output and one batch line). Stable field names first,
    extras after."""
    s = result.stats if result is not None else None
    spec = cfg.mode == "spec"
    tokens = s.tokens if s else None
    record: dict[str, Any] = {
        "file": file,
        "description": text,
        "mode": cfg.mode,
        "preset": preset,
        "threshold": (cfg.threshold if cfg.threshold != float("inf") else "inf") if spec else None,
        "k": cfg.k if spec else None,
        "verify": cfg.verify if spec else None,
        "tokens": tokens,
        "drafted_tokens": s.drafted_tokens if s and spec else None,
        "accepted_tokens": s.accepted_tokens if s and spec else None,
        "acceptance_rate": s.acceptance_rate if s and spec else None,
        "cloud_calls": s.cloud_calls if s else None,
        "cloud_call_rate": (s.cloud_calls / tokens if tokens else 0.0) if s else None,
        "cloud_tokens": s.cloud_tokens if s else None,
        "punct_density": punct_density(text) if text is not None else None,
        "repeat_rate": repeat_rate(text) if text is not None else None,
        "latency_s": latency_s,
        "error": error,
    }
    if s is not None:
        record["edge_forwards"] = s.edge_forwards
        record["tokens_per_s"] = (tokens / latency_s) if latency_s else None
        record["escalations"] = s.escalations if spec else None
        # All the cloud's work for the clip (cloud_calls/cloud_tokens count only what follows the
        # prompt): its prefill tokens (0 when it never ran), those plus the tokens fed after, and
        # every cloud forward, the prefill included.
        record["cloud_prefill_tokens"] = s.cloud_prefill_tokens
        record["cloud_work_tokens"] = s.cloud_work_tokens
        record["cloud_work_forwards"] = s.cloud_work_forwards
    record.update(extra)
    return record


def modelled_latency(latency_s: float, mode: str, cloud_calls: int, rtt_ms: float) -> float:
    """Latency an edge device on a real network would see: `rtt_ms` per cloud call for spec modes
    (the edge waits for each verdict), once per clip for cloud-only (upload, then stream back),
    nothing for edge-only. Computed, never slept."""
    if mode == "spec":
        return latency_s + cloud_calls * rtt_ms / 1000.0
    if mode == "cloud":
        return latency_s + rtt_ms / 1000.0
    return latency_s


def json_safe(value: Any) -> Any:
    """Strict JSON has no inf/NaN: inf is spelled "inf" (as the record's threshold is), NaN is null.
    Used for the batch/--json records and the eval report alike."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
