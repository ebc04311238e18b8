"""specdec from Python: load a pair once, describe clips (files or waveforms) under a preset or
explicit settings, and watch the blocks as they are decided.

    from specdec import Pair

    pair = Pair()                                   # the bundled demo pair
    result = pair.describe("clip.wav", preset="quality")
    print(result.description, result.cloud_calls)   # every field of `specdec describe --json`

The command line (`specdec_cli`) and this API share one implementation: the same loader, presets,
decoding pipeline and record.
"""

from specdec_cli import __version__

from .api import Pair, Result, Stream

__all__ = ["Pair", "Result", "Stream", "__version__"]
