"""specdec from Python: load a pair once, describe clips (files or waveforms) under a preset or
explicit settings, and watch the blocks as they are decided.

    from specdec import Pair

    pair = Pair()                                   # the bundled demo pair
    result = pair.describe("clip.wav", preset="quality")
    print(result.description, result.cloud_calls)   # every field of `specdec describe --json`

`Pair` is the library's service layer itself (specdec_cli/pair.py): the command line is built on
it, not the other way round, and importing specdec does not import the command line.
"""

from specdec_cli import __version__
from specdec_cli.corpus import Captioner, caption_with_ray
from specdec_cli.errors import InputError, ModelError, SpecdecError
from specdec_cli.pair import LowSampleRate, Pair, Result, Stream
from specdec_cli.segments import Piece, Segment
from specdec_cli.settings import Settings

__all__ = ["Captioner", "InputError", "LowSampleRate", "ModelError", "Pair", "Piece", "Result", "Segment", "Settings",
           "SpecdecError", "Stream", "__version__", "caption_with_ray"]
