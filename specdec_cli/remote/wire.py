"""The wire format shared by `specdec serve` and its client: typed messages (msgspec Structs),
sent as MessagePack by the client (binary audio without base64) and accepted as JSON too (for
curl and for reading); errors are always one-line JSON `{"error": ..., "code": ...}`.

What crosses the link, per clip (docs/serve.md, "What crosses the link"):
  * nothing until the first escalation;
  * then, once: the clip (FLAC when its samples are exactly 16- or 24-bit, else raw float32; never
    features), the prompt's token ids, the decoding settings, the answer so far and the draft;
  * after that: the token ids the server has not seen and the draft;
  * back: the verdict (a few bytes). Only with --sample, at a rejection, the target's distribution
    at that position comes back (its non-zero entries), because the residual draw needs the
    drafter's distribution there, which stays on the edge.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import Meta

from ..audio import MAX_PEAK

# 2: the client names its sessions (a request carrying the clip opens the session under the id it
# gives, so that a session-affine router places the first request where the rest will follow).
# 3: a verification names the prefix it assumes (`held` and `prefix`, a digest of its tokens); the
# server runs one session's verifications in order, and refuses one whose assumption is not the
# session's verified prefix as out of sync, with no forward and the session unchanged (issue 43:
# the groundwork for several verifications in flight per clip).
PROTOCOL = 3
MSGPACK = "application/msgpack"
JSON = "application/json"

# -- the schema -------------------------------------------------------------------------------------
# Every field that crosses the wire is checked where it is declared, by msgspec while it decodes
# (types, ranges, finite floats, lengths; a nested value where a scalar belongs is refused at its
# first byte, so nesting depth is bounded by the schema itself). What depends on the hosted model
# (token ids within its vocabulary, lengths within its context, the clip's length and rate) the
# server checks next, still before any model runs (server.py). The same structs give the OpenAPI
# document (openapi.py).

MAX_DRAFT = 256             # tokens in one draft (k is a handful; the bound keeps one request's work bounded)
MAX_NEW_TOKENS = 4096       # a config may not ask the server for more than this
# Ids in one list: the longest context of the thinkers specdec serves (Qwen2.5-Omni's, 32,768; the
# hosted model's own, in /health, bounds it further, checked from the lengths before any id is
# looked at). Issue 55: at 2^20, one verification's `pending` cost the server 80-130 ms to decode
# and check, id by id, before it was refused. MessagePack states a list's length before its items,
# so msgspec refuses a longer list at once.
MAX_TOKENS = 32768
MAX_TEXT = 4096             # characters of an instruction or system turn
MAX_SESSION_ID = 64         # a session id is 22 characters (128 random bits, base64url)
PREFIX_PATTERN = r"^[0-9a-f]{16}$"  # a prefix digest (prefix_digest)
# A session id a client may choose: URL-safe base64 of at least 128 random bits (what
# `secrets.token_urlsafe(16)` gives, and what the server mints when the client names none).
SESSION_ID_PATTERN = r"^[A-Za-z0-9_-]{22,64}$"
SESSION_HEADER = "X-Session-Id"  # every request of a session carries its id here (the router's key)

TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1, description="a token id (the server checks it against its vocabulary)")]
TokenIds = Annotated[list[TokenId], Meta(max_length=MAX_TOKENS)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0, description="finite, in [0, 1]")]
Count = Annotated[int, Meta(ge=0, le=2**31 - 1)]


class Clip(msgspec.Struct, forbid_unknown_fields=True):
    """One clip as the cloud must hear it: the audio at the model's rate, and the prompt's ids
    (its audio placeholders included: the server checks their count against the features)."""
    audio: Annotated[bytes, Meta(description="FLAC (16- or 24-bit mono), or little-endian float32 samples")]
    codec: Literal["flac", "f32"]
    rate: Annotated[int, Meta(ge=1, le=1_000_000, description="samples per second (the model's rate)")]
    prompt_ids: Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_TOKENS)]


class Sampling(msgspec.Struct, forbid_unknown_fields=True):
    """The client's half of rejection sampling for one block: the drafter's probability of each
    draft token and the block's uniforms, drawn on the client from its seeded generator exactly as
    the in-process rule draws them (acceptance.sampling_uniforms). All finite, in [0, 1]: a NaN
    uniform would accept any draft token."""
    p_draft: Annotated[list[Probability], Meta(min_length=1, max_length=MAX_DRAFT)]
    u: Annotated[list[Probability], Meta(min_length=1, max_length=MAX_DRAFT)]
    u_last: Probability


class DecodingSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The decoding settings a session is opened with: the fields of decoding.config.DecodingConfig
    (what the client sends: `cfg.as_dict()`), each with the range the server accepts. Defaults are
    DecodingConfig's (tests/test_wire_properties.py keeps the two in step). The server sets `mode`
    itself (spec for /v1/verify, cloud for /v1/generate); the edge-side fields (k, threshold,
    uncertainty, verify, gate_upload, gate_verify, seed, instruction, system) are checked but not
    used by a verification."""
    mode: Literal["spec", "edge", "cloud"] = "spec"
    k: Annotated[int, Meta(ge=1, le=MAX_DRAFT)] = 4
    threshold: Annotated[float, Meta(ge=0.0, description="nats; inf never escalates")] = 5.5
    uncertainty: Literal["sum", "max", "mean"] = "sum"
    verify: Literal["entropy", "always", "meaning"] = "entropy"
    gate_upload: Annotated[float, Meta(ge=0.0, description="the meaning gate's limit before upload; inf never")] = 0.5
    gate_verify: Annotated[float, Meta(ge=0.0, description="the meaning gate's limit once uploaded; inf never")] = 0.5
    constraints: bool = True
    max_new_tokens: Annotated[int, Meta(ge=1, le=MAX_NEW_TOKENS)] = 64
    sample: bool = False
    # Outside these ranges the warpers overflow float32 (1e-300 or inf: every score inf or NaN).
    temperature: Annotated[float, Meta(ge=1e-3, le=1e3)] = 1.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=0, le=2**31 - 1)] = 0
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] = 0  # int64 (torch.Generator.manual_seed takes it)
    instruction: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)] | None = None
    system: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)] | None = None
    repetition_penalty: Annotated[float, Meta(ge=1e-2, le=1e2)] = 1.2
    no_repeat_ngram: Annotated[int, Meta(ge=2, le=1024)] = 4
    comma_min_chars: Annotated[int, Meta(ge=0, le=MAX_NEW_TOKENS)] = 4
    stop_min_chars: Annotated[int, Meta(ge=0, le=MAX_NEW_TOKENS)] = 12


class VerifyRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Score `draft` after the session's tokens + `pending`, judge it, roll back to what it kept.
    With `clip` it opens a session (`config` is then required, and `pending` is the answer accepted
    so far; the prompt comes from the clip): under the id `session` when given (the client's,
    matching SESSION_ID_PATTERN; one the same token holds is replaced: a rebuild), else under one
    the server mints. Without `clip`, `session` names the session to verify in, and the request
    names the prefix it assumes the session holds: `held` tokens (prompt included) whose answer
    part (the tokens after the prompt) has the digest `prefix` (prefix_digest), followed by
    `pending`, whose first token must be the one the session's last verdict gave (where the server
    drew it: not after a sampled rejection, whose token the client draws). A request whose
    assumption does not hold is refused (409 out_of_sync) before any forward, the session
    unchanged. Without `prefix` only `held` is checked (what protocol 2 checked)."""
    draft: Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_DRAFT)]
    session: Annotated[str, Meta(min_length=1, max_length=MAX_SESSION_ID)] | None = None
    clip: Clip | None = None
    config: DecodingSettings | None = None
    held: Count = 0
    pending: TokenIds = []
    sampling: Sampling | None = None
    prefix: Annotated[str, Meta(pattern=PREFIX_PATTERN, description="prefix_digest of the answer tokens the "
                                "session holds, as the client assumes them")] | None = None


class OpenRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Open a session with the clip and run its prefill now (`--upload eager`): the server hears
    the clip while the edge drafts, and the first verification sends only ids. `session`: the id
    to open it under (as in VerifyRequest), else one the server mints."""
    clip: Clip
    config: DecodingSettings
    session: Annotated[str, Meta(pattern=SESSION_ID_PATTERN)] | None = None


class Opened(msgspec.Struct):
    session: str
    held: int              # tokens the session holds (the prompt)
    prefilled: int         # prompt tokens this request ran
    all_forwards: int      # forwards this request ran


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
    config: DecodingSettings
    pad_id: TokenId | None = None


class GenerateResponse(msgspec.Struct):
    tokens: list[int]
    stats: dict[str, int]


class ErrorBody(msgspec.Struct):
    """Every answer other than 200: one line for a person, a code for a program."""
    error: str
    code: str


class ReplicaHealth(msgspec.Struct):
    """One replica of a fleet (`specdec serve --replicas N`) in /health."""
    replica: str         # Ray Serve's replica id
    pid: int             # its process (the one to kill to see failover)
    node: str            # the Ray node it runs on
    sessions: int        # sessions it holds


class Health(msgspec.Struct):
    """GET /health: what the server hosts and how it is set up. `sessions`: open sessions (a
    fleet's: over its replicas); `replicas`: 1 for one process, else the fleet's live replicas,
    each in `per_replica` (empty for one process)."""
    status: Literal["ok"]
    model: str
    fingerprint: str     # the weights' hash
    tokenizer: str       # the vocabulary's hash: edge and cloud must share it
    vocab: int
    dtype: str
    device: str
    context: int         # tokens in the model's window
    rate: int            # samples per second the model hears
    max_seconds: float   # longest clip
    min_samples: int     # shortest clip (one audio token)
    protocol: int
    version: str
    sessions: int
    max_sessions: int
    max_sessions_per_token: int
    session_ttl_s: float
    batch_window_ms: float
    max_batch: int
    replicas: int = 1
    per_replica: list[ReplicaHealth] = []


class Closed(msgspec.Struct):
    """DELETE /v1/sessions/{id}."""
    closed: bool


def encode(message: msgspec.Struct) -> bytes:
    return msgspec.msgpack.encode(message)


def decoder(kind: type, content_type: str | None):
    """A decoder for `kind` by the request's content type (MessagePack, else JSON)."""
    return _decoder(kind, bool(content_type and content_type.split(";")[0].strip().lower() == MSGPACK))


@functools.cache
def _decoder(kind: type, msgpack: bool) -> Any:
    return msgspec.msgpack.Decoder(kind) if msgpack else msgspec.json.Decoder(kind)


class BadMessage(ValueError):
    """A body that is not a well-formed `kind` (the server answers 400 with this one line)."""


# The most list entries (and commas in its two texts) a request of any kind can hold, with room for
# its fields: a JSON body with more commas than this is refused before it is decoded. msgspec checks
# a JSON list's max_length only once the whole list is decoded (JSON gives no length up front): a
# body of 2^20 ids took 39 ms to refuse. Counting commas is one pass in C (bytes.count); written by
# hand because no JSON decoder we know bounds a list while it reads it.
MAX_JSON_COMMAS = 2 * MAX_TOKENS + 3 * MAX_DRAFT + 2 * MAX_TEXT + 64
_COUNT_COMMAS_FROM = 64 * 1024  # a shorter body decodes in microseconds whatever it holds


def decode(kind: type, body: bytes, content_type: str | None) -> Any:
    """The request body as a `kind`, every declared constraint checked; BadMessage otherwise.
    Nothing else escapes: a decoder that raised anything but a refusal would be a specdec bug."""
    dec = decoder(kind, content_type)
    if (isinstance(dec, msgspec.json.Decoder) and len(body) > _COUNT_COMMAS_FROM
            and body.count(b",") > MAX_JSON_COMMAS):
        raise BadMessage(f"malformed {kind.__name__}: more list entries than any request holds "
                         f"(a list of ids holds at most {MAX_TOKENS})")
    try:
        return dec.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadMessage(f"malformed {kind.__name__}: {first_line(exc)}") from None


# -- the clip's audio -------------------------------------------------------------------------------

class BadAudio(ValueError):
    """A clip the server will not decode: not FLAC/float32 as declared, too long, or not finite."""


class TooLong(BadAudio):
    """A clip over the length limit (the server answers 413)."""


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


def decode_audio(data: bytes, codec: str, max_samples: int, rate: int | None = None) -> np.ndarray:
    """Back to the float32 samples `encode_audio` was given (exactly), bounded before it is
    decoded: a float32 clip by its byte count, a FLAC clip by the frame count in its header, and
    either way at most `max_samples` + 1 frames are ever read (a streamed FLAC says 0, i.e.
    "unknown", in its header: it is read under the same bound, and refused as too long past it).
    NaN or infinite samples are refused, and so are samples over audio.MAX_PEAK. BadAudio (a ValueError; TooLong for the length) for
    anything the server will not hear."""
    seconds = f"{max_samples / rate:g} s at {rate} Hz" if rate else f"{max_samples} samples"
    if codec == "f32":
        if len(data) % 4:
            raise BadAudio("float32 audio must be a whole number of 4-byte samples")
        if len(data) // 4 > max_samples:
            raise TooLong(f"the clip holds {len(data) // 4} samples; at most {max_samples} ({seconds})")
        audio = np.frombuffer(data, dtype="<f4").astype(np.float32)
    elif codec == "flac":
        audio = _decode_flac(data, max_samples, rate, seconds)
    else:
        raise BadAudio(f"unknown codec {codec!r}: flac or f32")
    if not np.isfinite(audio).all():
        raise BadAudio("the clip holds NaN or infinite samples")
    if len(audio) and (peak := float(np.abs(audio).max())) > MAX_PEAK:
        raise BadAudio(f"the clip holds samples up to {peak:.3g}, over {MAX_PEAK:g} times full scale (1.0): "
                       "not a recording")
    return audio


_UNKNOWN_FRAMES = 2**63 - 1  # what libsndfile reports for a FLAC whose header says 0 (streamed)


def _decode_flac(data: bytes, max_samples: int, rate: int | None, seconds: str) -> np.ndarray:
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.format != "FLAC":
                raise BadAudio(f"the clip is {f.format}, not FLAC")
            if f.channels != 1:
                raise BadAudio(f"the clip must be mono, got {f.channels} channels")
            bits = {"PCM_16": 16, "PCM_24": 24}.get(f.subtype)
            if bits is None:
                raise BadAudio(f"FLAC clips must be 16- or 24-bit, got {f.subtype}")
            if rate is not None and f.samplerate != rate:
                raise BadAudio(f"the FLAC header says {f.samplerate} Hz; the clip was sent as {rate} Hz")
            frames = f.frames
            unknown = frames == _UNKNOWN_FRAMES
            if not unknown and f.frames > max_samples:
                raise TooLong(f"the clip holds {f.frames} samples; at most {max_samples} ({seconds})")
            try:
                ints = f.read(max_samples + 1, dtype="int32")  # left-aligned: value << (32 - bits)
            except RuntimeError:
                if not unknown:
                    raise
                # libsndfile 1.2 fails at the end of a FLAC whose length it does not know (it
                # seeks there); a longer one was refused above by the read's own bound. Better
                # refused than cut: the clip would be heard without its end.
                raise BadAudio("a FLAC with no sample count in its header (written to a pipe) cannot be read "
                               "to its end here: send it with its count (as specdec does) or as float32") from None
    except BadAudio:
        raise
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as exc:
        # libsndfile's errors (soundfile.LibsndfileError is a RuntimeError) for bytes that are not FLAC
        # libsndfile names the BytesIO object first: its own words are after the last colon
        raise BadAudio(f"the audio does not decode ({first_line(exc).rsplit(': ', 1)[-1]})") from None
    if len(ints) > max_samples:
        raise TooLong(f"the clip holds more than {max_samples} samples ({seconds})")
    if not unknown and len(ints) < frames:
        raise BadAudio(f"the clip ends after {len(ints)} of the {frames} samples its header announces (cut short?)")
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


# -- prefixes ---------------------------------------------------------------------------------------

def prefix_digest(tokens: list[int]) -> str:
    """The digest a verification names its assumed prefix by: SHA-256 of the answer's token ids
    (the tokens after the prompt) as little-endian int64, its first 64 bits in hex. The whole answer
    rather than the tokens since the last verdict: the server then needs no record of which
    verdict the client had seen, and hashing a few thousand ids costs microseconds. 64 bits: a
    stale request matches by chance with probability 2^-64."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i8").tobytes()).hexdigest()[:16]


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
