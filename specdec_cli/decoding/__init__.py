"""The decoding engine. It knows nothing about files, terminals or JSON: it takes models, thinker
inputs and a DecodingConfig, and returns token ids, per-block events and counters.

Names are resolved lazily (PEP 562): importing `specdec_cli.decoding.config` for a flag check
must not pay for importing torch and transformers (seconds on a small machine)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BlockEvent": "loop",
    "DecodeResult": "loop",
    "speculative_decode": "loop",
    "DecodingConfig": "config",
    "generate_baseline": "baselines",
    "DecodingRules": "processors",
    "VocabMasks": "processors",
}

__all__ = ["BlockEvent", "DecodeResult", "DecodingConfig", "DecodingRules", "VocabMasks", "generate_baseline",
           "speculative_decode"]

if TYPE_CHECKING:
    from .baselines import generate_baseline
    from .config import DecodingConfig
    from .loop import BlockEvent, DecodeResult, speculative_decode
    from .processors import DecodingRules, VocabMasks


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
