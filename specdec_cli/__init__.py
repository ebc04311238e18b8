"""specdec: edge-cloud speculative decoding that describes a speaker in one Chinese sentence."""

__version__ = "0.3.0"
