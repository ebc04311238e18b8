"""The client's checks of what a server answers. A server is a machine the client does not control:
each answer is decoded into its declared type and then checked against what the client sent and
what the server said of itself in /health, before any of it reaches the decoding loop. A failed
check raises `Unusable` saying what was wrong; the client turns it into an error for that clip
(never a description made from a bad answer).

What a verdict must satisfy (the in-process verifier's invariants, decoding/verifier.py and
remote/batching.py): `accepted` within the draft; `bonus` exactly when the whole draft is
accepted; a token within the vocabulary; a target row only where the client draws the recovered
token itself (sampling, a rejection), as wide as the vocabulary, a probability distribution; the
tokens the session holds, those fed and the prompt tokens prefilled equal to what the request
implies; a session id the client can put in a URL. An eager open's answer (`opened`) is held to
the same: the server's own id pattern, the prompt held, prefilled and its forwards in range.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec
import numpy as np

from . import wire
from .exchange import Unusable

# Widest vocabulary a client accepts from /health: the largest released LM vocabularies are
# ~262k; this bounds the one row an answer may carry (4 bytes per entry) to 16 MB.
MAX_VOCAB = 1 << 22
HEALTH_CAP = 64 * 1024     # bytes of /health (a few hundred in practice)
ANSWER_SLACK = 64 * 1024   # bytes of an answer beyond its probability row / tokens
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # what the server mints: token_urlsafe(16), 22 chars
ROW_SUM_TOLERANCE = 1e-3   # float32 softmax over <= 4M entries sums to 1 within ~1e-5


class Identity(msgspec.Struct):
    """The fields of /health the client relies on (others are shown, never used)."""
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]
    fingerprint: Annotated[str, msgspec.Meta(max_length=200)]
    tokenizer: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    vocab: Annotated[int, msgspec.Meta(ge=1, le=MAX_VOCAB)]
    rate: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
    protocol: int


def answer_cap(vocab: int | None) -> int:
    """Bytes a verify answer may take: one probability row at most (4 bytes an entry dense, fewer
    sparse: the server sends the smaller form), plus the verdict."""
    return ANSWER_SLACK + 4 * (vocab or 0)


def health(body: bytes) -> dict[str, Any]:
    """/health as a dict, its identity fields present and well-typed."""
    try:
        info = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise Unusable(f"its /health is not JSON ({_first(exc)})") from None
    if not isinstance(info, dict):
        raise Unusable(f"its /health is a JSON {type(info).__name__}, not an object")
    try:
        identity = msgspec.convert(info, Identity)
    except msgspec.ValidationError as exc:
        raise Unusable(f"its /health is not a specdec server's: {_first(exc)}") from None
    if identity.protocol != wire.PROTOCOL:
        raise Unusable(f"it speaks protocol {identity.protocol}, this specdec speaks {wire.PROTOCOL}")
    return info


def decode(body: bytes, kind: type) -> Any:
    """`body` (MessagePack) as a `kind`, or Unusable with msgspec's words for what is wrong."""
    try:
        return msgspec.msgpack.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Unusable(f"{_first(exc)}") from None


def verdict(answer: wire.VerifyResponse, request: wire.VerifyRequest, sequence_len: int, prompt_len: int,
            vocab: int) -> None:
    """`answer` checked against the request it answers. `sequence_len`: the tokens the request
    stands for (prompt, answer so far) before the draft; `prompt_len`: the prompt's."""
    k = len(request.draft)
    if not 0 <= answer.accepted <= k:
        raise Unusable(f"the verdict accepts {answer.accepted} tokens of a {k}-token draft")
    if (answer.kind == "bonus") != (answer.accepted == k):
        raise Unusable(f"a {answer.kind!r} token after {answer.accepted} of {k} draft tokens accepted")
    sampled_rejection = request.sampling is not None and answer.kind == "recovered"
    if sampled_rejection != (answer.target_row is not None):
        raise Unusable("a probability row where none was due" if answer.target_row is not None
                       else "no probability row for a rejected sampled draft")
    if answer.target_row is None and not 0 <= answer.token < vocab:
        raise Unusable(f"token {answer.token}, outside the vocabulary of {vocab} it reported")
    new = request.clip is not None  # a request carrying the clip opened the session (prefilled it)
    expected = {"held": sequence_len + answer.accepted, "fed": len(request.pending) + k,
                "prefilled": prompt_len if new else 0}
    for name, want in expected.items():
        if getattr(answer, name) != want:
            raise Unusable(f"{name} = {getattr(answer, name)} where the request implies {want}")
    if not 0 <= answer.forwards <= answer.all_forwards <= answer.fed + answer.prefilled:
        raise Unusable(f"{answer.forwards} forwards of {answer.all_forwards} for {answer.fed + answer.prefilled} tokens")
    if not answer.ended and not SESSION_ID.fullmatch(answer.session):
        raise Unusable(f"a session id of {len(answer.session)} characters, not the URL-safe id it mints")
    # Protocol 2: the client names a session it opens, and a session-affine router places its later
    # requests by that name; an answer under another id would send them where the session is not.
    if not answer.ended and request.session is not None and answer.session != request.session:
        raise Unusable("a session id other than the one the request named")


def opened(answer: wire.Opened, prompt_len: int, session: str | None = None) -> None:
    """An eager open's answer, checked as a verdict is (issue 33): the session id is the URL-safe id
    the server mints, and it holds the prompt, prefilled by at least one forward and at most one a token."""
    if not SESSION_ID.fullmatch(answer.session):
        raise Unusable(f"a session id of {len(answer.session)} characters, not the URL-safe id it mints")
    if session is not None and answer.session != session:
        raise Unusable("a session id other than the one the open named")
    expected = {"held": prompt_len, "prefilled": prompt_len}
    for name, want in expected.items():
        if getattr(answer, name) != want:
            raise Unusable(f"{name} = {getattr(answer, name)} where the opened prompt implies {want}")
    if not 1 <= answer.all_forwards <= answer.prefilled:
        raise Unusable(f"{answer.all_forwards} forwards for a prefill of {answer.prefilled} tokens")


def target_row(row: wire.SparseRow, vocab: int) -> np.ndarray:
    """The row, dense, once it is a probability distribution over the vocabulary."""
    if row.width != vocab:
        raise Unusable(f"a probability row {row.width} wide for a vocabulary of {vocab}")
    if not row.index:
        if len(row.value) != 4 * vocab:
            raise Unusable(f"a dense row of {len(row.value)} bytes for {vocab} entries")
        dense = np.frombuffer(row.value, dtype="<f4").astype(np.float32)
    else:
        if len(row.index) % 4 or len(row.value) != len(row.index) or len(row.index) // 4 > vocab:
            raise Unusable(f"a sparse row of {len(row.index)} index and {len(row.value)} value bytes")
        index = np.frombuffer(row.index, dtype="<i4")
        if index[0] < 0 or index[-1] >= vocab or (len(index) > 1 and not (np.diff(index) > 0).all()):
            raise Unusable("a sparse row whose indices are not increasing within the vocabulary")
        dense = np.zeros(vocab, dtype=np.float32)
        dense[index] = np.frombuffer(row.value, dtype="<f4")
    if not np.isfinite(dense).all() or (dense < 0).any():
        raise Unusable("a probability row with negative or non-finite entries")
    total = float(dense.sum(dtype=np.float64))
    if abs(total - 1.0) > ROW_SUM_TOLERANCE:
        raise Unusable(f"a probability row summing to {total:.6g}, not 1")
    return dense


def generated(answer: wire.GenerateResponse, vocab: int, max_new_tokens: int) -> None:
    if len(answer.tokens) > max_new_tokens:
        raise Unusable(f"{len(answer.tokens)} tokens where at most {max_new_tokens} were asked for")
    bad = next((t for t in answer.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise Unusable(f"token {bad}, outside the vocabulary of {vocab} it reported")
    negative = next((name for name, value in answer.stats.items() if value < 0), None)
    if negative is not None:
        raise Unusable(f"a negative count {negative} = {answer.stats[negative]}")


def generate_cap(max_new_tokens: int) -> int:
    """Bytes a cloud-only answer may take: its tokens (9 bytes each in MessagePack at most) and stats."""
    return ANSWER_SLACK + 9 * max_new_tokens


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
