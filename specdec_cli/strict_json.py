"""Strict JSON for records, settings and reports: no inf or NaN (json.dumps would write the
non-standard Infinity / NaN that other tools refuse)."""

from __future__ import annotations

import json
import math
from typing import Any


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


def dumps_record(record: dict[str, Any]) -> str:
    """One record as one line of strict JSON (no newline)."""
    return json.dumps(json_safe(record), ensure_ascii=False, allow_nan=False)
