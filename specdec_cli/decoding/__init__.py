"""The decoding engine. It knows nothing about files, terminals or JSON: it takes models, thinker
inputs and a DecodingConfig, and returns token ids, per-block events and counters."""

from .baselines import generate_baseline
from .config import DecodingConfig
from .loop import BlockEvent, DecodeResult, speculative_decode
from .processors import DecodingRules, VocabMasks

__all__ = [
    "BlockEvent",
    "DecodeResult",
    "DecodingConfig",
    "DecodingRules",
    "VocabMasks",
    "generate_baseline",
    "speculative_decode",
]
