"""The wire format shared by `specdec serve` and its client: typed messages (msgspec Structs),
sent as MessagePack by the client (binary audio without base64) and accepted as JSON too (for
curl and for reading); errors are always one-line JSON `{"error": ..., "code": ...}`.

What crosses the link, per clip (README, "The remote cloud"):
  * nothing until the first escalation;
  * then, once: the clip (FLAC when its samples are exactly 16- or 24-bit, else raw float32; never
    features), the prompt's token ids, the decoding settings, the answer so far and the draft;
  * after that: the token ids the server has not seen and the draft;
  * back: the verdict (a few bytes). Only with --sample, at a rejection, the target's distribution
    at that position comes back (its non-zero entries), because the residual draw needs the
    drafter's distribution there, which stays on the edge.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any, Literal

import msgspec
import numpy as np

PROTOCOL = 1
MSGPACK = "application/msgpack"
JSON = "application/json"


class Clip(msgspec.Struct, forbid_unknown_fields=True):
    """One clip as the cloud must hear it: the audio at the model's rate, and the prompt's ids
    (its audio placeholders included: the server checks their count against the features)."""
    audio: bytes
    codec: Literal["flac", "f32"]
    rate: int
    prompt_ids: list[int]


class Sampling(msgspec.Struct, forbid_unknown_fields=True):
    """The client's half of rejection sampling for one block: the drafter's probability of each
    draft token and the block's uniforms, drawn on the client from its seeded generator exactly as
    the in-process rule draws them (acceptance.sampling_uniforms)."""
    p_draft: list[float]
    u: list[float]
    u_last: float


class VerifyRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Score `draft` after the session's tokens + `pending`, judge it, roll back to what it kept.
    Without `session` it opens one: `clip` and `config` are then required, and `pending` is the
    answer accepted so far (the prompt comes from the clip)."""
    draft: list[int]
    session: str | None = None
    clip: Clip | None = None
    config: dict[str, Any] | None = None
    held: int = 0
    pending: list[int] = []
    sampling: Sampling | None = None


class SparseRow(msgspec.Struct):
    """A probability row, exact: its non-zero entries (int32 indices, float32 values,
    little-endian), or, when that would be larger (most entries non-zero), every value with no
    index (`index` empty)."""
    width: int
    index: bytes
    value: bytes


class VerifyResponse(msgspec.Struct):
    session: str
    accepted: int
    token: int
    kind: Literal["recovered", "bonus"]
    held: int              # tokens the session holds after the rollback (prompt included)
    fed: int               # tokens this request fed after the prompt
    prefilled: int         # prompt tokens this request ran (the lazy prefill)
    forwards: int          # forwards that fed tokens after the prompt
    all_forwards: int      # every forward
    target_row: SparseRow | None = None  # sampling, rejected: the target's distribution there
    ended: bool = False    # the verdict ends the clip (the loop's own stop rule): the session is closed


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Cloud-only: the whole description on the server (one round trip)."""
    clip: Clip
    config: dict[str, Any]
    pad_id: int | None = None


class GenerateResponse(msgspec.Struct):
    tokens: list[int]
    stats: dict[str, int]


class ErrorBody(msgspec.Struct):
    error: str
    code: str


def encode(message: msgspec.Struct) -> bytes:
    return msgspec.msgpack.encode(message)


def decoder(kind: type, content_type: str | None):
    """A decoder for `kind` by the request's content type (MessagePack, else JSON)."""
    if content_type and content_type.split(";")[0].strip().lower() == MSGPACK:
        return msgspec.msgpack.Decoder(kind)
    return msgspec.json.Decoder(kind)


# -- the clip's audio -------------------------------------------------------------------------------

def encode_audio(audio: np.ndarray, rate: int) -> tuple[bytes, str]:
    """The clip as compact as it can be without changing a sample the cloud hears: FLAC (lossless)
    when every sample is exactly a 16- or 24-bit PCM value (what soundfile gives for such files,
    resampling aside), else the float32 samples as they are."""
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    for bits, subtype in ((16, "PCM_16"), (24, "PCM_24")):
        full = 1 << (bits - 1)
        scaled = audio.astype(np.float64) * full
        if (np.all(scaled == np.round(scaled)) and scaled.max(initial=0) < full
                and scaled.min(initial=0) >= -full):
            import soundfile as sf

            buf = io.BytesIO()
            # libsndfile reads int32 as full scale: left-align the PCM value (exact both ways).
            ints = (scaled.astype(np.int64) << (32 - bits)).astype(np.int32)
            sf.write(buf, ints, rate, format="FLAC", subtype=subtype)
            return buf.getvalue(), "flac"
    return audio.astype("<f4").tobytes(), "f32"


def decode_audio(data: bytes, codec: str) -> np.ndarray:
    """Back to the float32 samples `encode_audio` was given (exactly)."""
    if codec == "f32":
        if len(data) % 4:
            raise ValueError("float32 audio must be a whole number of 4-byte samples")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    import soundfile as sf

    with sf.SoundFile(io.BytesIO(data)) as f:
        if f.channels != 1:
            raise ValueError(f"the clip must be mono, got {f.channels} channels")
        bits = {"PCM_16": 16, "PCM_24": 24}.get(f.subtype)
        if bits is None:
            raise ValueError(f"FLAC clips must be 16- or 24-bit, got {f.subtype}")
        ints = f.read(dtype="int32")  # left-aligned: value << (32 - bits)
    return (ints.astype(np.float64) / 2**31).astype(np.float32)


# -- sparse probability rows ------------------------------------------------------------------------

def sparse_row(row: Any) -> SparseRow:
    """A 1-D float tensor/array, exact, in the smaller of the two forms: its non-zero entries (8
    bytes each: a truncated distribution, under --top-k/--top-p or the rules' bans) or all of it
    (4 bytes each: a full softmax, where almost nothing is exactly zero)."""
    values = np.asarray(row, dtype=np.float32)
    index = np.flatnonzero(values).astype("<i4")
    if 2 * len(index) >= len(values):
        return SparseRow(int(values.shape[0]), b"", values.astype("<f4").tobytes())
    return SparseRow(int(values.shape[0]), index.tobytes(), values[index].astype("<f4").tobytes())


def dense_row(row: SparseRow) -> np.ndarray:
    if not row.index:
        return np.frombuffer(row.value, dtype="<f4").astype(np.float32)
    out = np.zeros(row.width, dtype=np.float32)
    out[np.frombuffer(row.index, dtype="<i4")] = np.frombuffer(row.value, dtype="<f4")
    return out


# -- fingerprints -----------------------------------------------------------------------------------

def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Same vocabulary (token -> id) and special tokens <=> same fingerprint: what the edge and a
    remote cloud must share, since they exchange token ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    blob = json.dumps([vocab, list(tokenizer.all_special_tokens)], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
