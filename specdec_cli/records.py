"""The result record of one clip (the `--json` output, one line of a batch, one row of eval), in
strict JSON. Field by field: docs/records.md ("Every field").

`clip_record` and `error_record` are the one place a described (or failed) clip becomes a record:
the CLI, the API, batch, the Ray workers all build theirs here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .audio import band_limited
from .errors import RETRYABLE
from .metrics import punct_density, repeat_rate

if TYPE_CHECKING:
    import numpy as np

    from .decoding.config import DecodingConfig
    from .decoding.loop import DecodeResult
    from .describe import Description
    from .models import ModelPair
    from .segments import Segment
    from .settings import Settings

RECORD_FIELDS = (
    "file", "description", "mode", "preset", "threshold", "k", "verify", "tokens", "drafted_tokens",
    "accepted_tokens", "acceptance_rate", "cloud_calls", "cloud_call_rate", "cloud_tokens",
    "punct_density", "repeat_rate", "latency_s", "error",
)


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
        # The clip never reached the cloud: no upload, no prefill, no round trip (edge-only, or a
        # speculative run whose every block stayed on the edge).
        record["cloud_free"] = s.cloud_work_forwards == 0
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


def _context(pair: ModelPair, settings: Settings) -> dict[str, Any]:
    """What every record of a run carries after the stable fields: the models and the settings."""
    return {"edge": pair.edge_id, "cloud": pair.cloud_id, "settings": settings.run.as_record()}


def clip_record(pair: ModelPair, settings: Settings, file: str, audio: np.ndarray,
                desc: Description, segment: Segment | None = None) -> dict[str, Any]:
    """The record of one described clip: `file` as the caller names it, `audio` its samples at the
    model's rate, `desc` what describe.Describer made of it; for a segment of a long recording
    (`segment`), `file` is the recording and the record ends with where the segment is."""
    extra = _context(pair, settings)
    extra["audio_s"] = round(len(audio) / pair.processor.sampling_rate, 3)
    # Nothing above 4 kHz (a telephone line, an 8 kHz recording): the models may mishear the voice
    extra["band_limited"] = band_limited(audio, pair.processor.sampling_rate)
    if (pair.remote is not None or pair.cloud_down is not None) and desc.link is not None:
        # Counted at this end of the link: bytes up and down, round trips, time waiting (none when
        # the cloud was down from the start: cloud_url is then the address given).
        extra.update(desc.link.as_record(), cloud_url=pair.remote.url if pair.remote is not None else pair.cloud_id)
        extra.update(fallback_fields(desc.result))
    cfg = settings.cfg
    if settings.rtt_ms is not None:
        extra["cloud_rtt_ms"] = settings.rtt_ms
        extra["latency_modelled_s"] = modelled_latency(desc.latency_s, cfg.mode, desc.result.stats.cloud_calls,
                                                       settings.rtt_ms)
    if segment is not None:
        extra.update(segment.fields())
    return build_record(file, desc.text, desc.result, cfg, settings.preset, desc.latency_s, None, **extra)


def fallback_fields(result: DecodeResult) -> dict[str, Any]:
    """Whether the edge finished the clip alone because its remote cloud failed (decoding.loop.
    CloudLost): the failure's word, its message, the answer's length when the edge went on alone,
    and its length through the cloud's last verdict; all null when the cloud did its part."""
    lost = result.lost
    if lost is None:
        return {"fallback": None, "fallback_error": None, "fallback_at_tokens": None, "fallback_verified_tokens": None}
    return {"fallback": lost.failure, "fallback_error": lost.error, "fallback_at_tokens": lost.at,
            "fallback_verified_tokens": lost.verified}


def error_record(pair: ModelPair, settings: Settings, file: str, message: str,
                 segment: Segment | None = None, kind: str = RETRYABLE) -> dict[str, Any]:
    """The record of a clip that failed: `error` says why, `error_kind` what kind of failure it is
    (errors.error_kind) and `retry` whether a rerun as it is may succeed (a batch retries it on
    resume either way). A segment's says which segment failed; a recording that could not be cut at
    all has no segment fields."""
    extra = _context(pair, settings)
    extra["error_kind"] = kind
    extra["retry"] = kind == RETRYABLE
    if segment is not None:
        extra.update(segment.fields())
    return build_record(file, None, None, settings.cfg, settings.preset, None, message, **extra)


def template_records(pair: ModelPair, settings: Settings) -> list[dict[str, Any]]:
    """Two records of this run's shape with made-up values, built by `clip_record` and
    `error_record` themselves: a described clip (every counter 1, and for a remote cloud a link and
    a fallback, so no field that can hold a number is left None) and a failed one. A table of the
    run's records (corpus.RecordColumns) takes its columns and their types from these before any
    clip is described, so every batch, process and worker writes the same schema; a field added to
    the records shows up here without a word."""
    import dataclasses

    import numpy as np

    from .decoding.loop import CloudLost, DecodeResult, DecodeStats
    from .describe import Description

    def ones(cls: type) -> dict[str, Any]:  # 1 in each counter, 1.5 in each float (its type stays a float)
        return {f.name: 1.5 if "float" in str(f.type) else 1 for f in dataclasses.fields(cls) if f.init}

    stats = DecodeStats(**ones(DecodeStats))
    remote = pair.remote is not None or pair.cloud_down is not None
    result = DecodeResult([0], stats, lost=CloudLost("template", "template", 1, 1) if remote else None)
    link = None
    if remote:
        from .remote.client import LinkStats

        link = LinkStats(**ones(LinkStats))
    audio = np.zeros(pair.processor.sampling_rate, dtype=np.float32)
    described = clip_record(pair, settings, "template", audio, Description("template", result, 1.0, link))
    return [described, error_record(pair, settings, "template", "template")]
