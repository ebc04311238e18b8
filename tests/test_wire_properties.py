"""Property tests (hypothesis) of what `specdec serve` decodes from strangers (issue 25): the wire
decoders and the server-side audio decoder. Whatever bytes arrive, the answer is a decoded message
or a refusal (wire.BadMessage / wire.BadAudio, which the server answers with a one-line 4xx),
never another exception; a message that decodes satisfies every range the server relies on (an
independent, hand-written predicate of the ranges, not msgspec's); audio decodes exactly or is
refused, and is never longer than the limit."""

from __future__ import annotations

import dataclasses
import math

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specdec_cli.decoding import DecodingConfig
from specdec_cli.remote import wire

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = [wire.VerifyRequest, wire.GenerateRequest]
TYPES = [wire.MSGPACK, wire.JSON, None]


def test_the_settings_schema_has_decoding_configs_fields_and_defaults():
    """The wire's DecodingSettings is DecodingConfig with ranges: same fields, same defaults, and
    what the client sends (`cfg.as_dict()`) decodes to the same values."""
    config = {f.name: f.default for f in dataclasses.fields(DecodingConfig)}
    schema = {name: getattr(wire.DecodingSettings(), name) for name in wire.DecodingSettings.__struct_fields__}
    assert schema == config
    for cfg in (DecodingConfig(), DecodingConfig(sample=True, temperature=0.7, top_k=40, top_p=0.9, seed=2**40,
                                                 threshold=math.inf, instruction="说一句话", k=12)):
        sent = msgspec.msgpack.encode(wire.VerifyRequest([1], config=cfg.as_dict()))
        got = wire.decode(wire.VerifyRequest, sent, wire.MSGPACK).config
        assert msgspec.structs.asdict(got) == cfg.as_dict()


@FAST
@given(body=st.binary(max_size=3000), kind=st.sampled_from(KINDS), content_type=st.sampled_from(TYPES))
def test_any_bytes_decode_or_are_refused(body, kind, content_type):
    try:
        message = wire.decode(kind, body, content_type)
    except wire.BadMessage as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(message, kind)


# -- well-shaped messages with values of any type and size ------------------------------------------

anything = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
token = st.integers(-5, 2**31 + 5)
number = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**65), 2**65)
settings_values = {
    "k": st.integers(-3, 300) | anything, "threshold": number, "max_new_tokens": st.integers(-3, 5000),
    "temperature": number, "top_p": number, "top_k": st.integers(-3, 2**40) | number, "seed": st.integers(-(2**64), 2**64),
    "repetition_penalty": number, "no_repeat_ngram": st.integers(-3, 2000), "comma_min_chars": st.integers(-3, 5000),
    "stop_min_chars": st.integers(-3, 5000), "sample": st.booleans() | anything, "mode": st.sampled_from(["spec", "x"]),
    "instruction": st.none() | st.text(max_size=30) | anything, "bogus": anything,
}
probabilities = st.lists(number | st.floats(0, 1), max_size=6)
messages = st.fixed_dictionaries({"draft": st.lists(token, max_size=300) | anything}, optional={
    "session": st.text(max_size=80) | anything, "held": st.integers(-3, 2**40) | anything,
    "pending": st.lists(token, max_size=5),
    "config": st.fixed_dictionaries({}, optional=settings_values) | anything,
    "sampling": st.fixed_dictionaries({"p_draft": probabilities, "u": probabilities, "u_last": number}) | anything,
})


def in_range(x: object, lo: float, hi: float, integer: bool = False) -> bool:
    if isinstance(x, bool):
        return False
    if integer:
        return isinstance(x, int) and lo <= x <= hi
    return isinstance(x, (int, float)) and not math.isnan(x) and lo <= x <= hi


def valid_settings(c: object) -> bool:
    """The ranges the server relies on, written out by hand (docs/security.md)."""
    if not isinstance(c, dict) or not set(c) <= set(wire.DecodingSettings.__struct_fields__):
        return False
    ok = {"k": lambda v: in_range(v, 1, 256, True), "threshold": lambda v: in_range(v, 0, math.inf),
          "max_new_tokens": lambda v: in_range(v, 1, 4096, True), "temperature": lambda v: in_range(v, 1e-3, 1e3),
          "top_p": lambda v: in_range(v, 0, 1) and v > 0, "top_k": lambda v: in_range(v, 0, 2**31 - 1, True),
          "seed": lambda v: in_range(v, -(2**63), 2**63 - 1, True),
          "repetition_penalty": lambda v: in_range(v, 1e-2, 1e2), "no_repeat_ngram": lambda v: in_range(v, 2, 1024, True),
          "comma_min_chars": lambda v: in_range(v, 0, 4096, True), "stop_min_chars": lambda v: in_range(v, 0, 4096, True),
          "sample": lambda v: isinstance(v, bool), "mode": lambda v: v in ("spec", "edge", "cloud"),
          "instruction": lambda v: v is None or (isinstance(v, str) and 1 <= len(v) <= 4096)}
    return all(ok[k](v) for k, v in c.items())


def valid(m: dict) -> bool:
    draft = m["draft"]
    if not (isinstance(draft, list) and 1 <= len(draft) <= 256 and all(in_range(t, 0, 2**31 - 1, True) for t in draft)):
        return False
    if "session" in m and not (m["session"] is None or (isinstance(m["session"], str) and 1 <= len(m["session"]) <= 64)):
        return False
    if "held" in m and not in_range(m["held"], 0, 2**31 - 1, True):
        return False
    if "pending" in m and not all(in_range(t, 0, 2**31 - 1, True) for t in m["pending"]):
        return False
    if "config" in m and m["config"] is not None and not valid_settings(m["config"]):
        return False
    s = m.get("sampling")
    if s is not None:
        if not isinstance(s, dict) or set(s) != {"p_draft", "u", "u_last"}:
            return False
        if not all(isinstance(v, list) and 1 <= len(v) <= 256 and all(in_range(p, 0, 1) for p in v)
                   for v in (s["p_draft"], s["u"])) or not in_range(s["u_last"], 0, 1):
            return False
    return True


@FAST
@given(message=messages)
def test_a_well_shaped_message_decodes_exactly_when_every_value_is_in_range(message):
    try:
        body = msgspec.msgpack.encode(message)
    except (OverflowError, TypeError):
        return  # not representable in MessagePack (an int past 64 bits): nothing a client could send
    try:
        decoded = wire.decode(wire.VerifyRequest, body, wire.MSGPACK)
    except wire.BadMessage:
        event("refused")
        assert not valid(message), message
        return
    event("decoded")
    assert valid(message), message
    assert list(decoded.draft) == message["draft"]


# -- the server-side audio decoder -------------------------------------------------------------------

@SLOW
@given(body=st.binary(max_size=5000), limit=st.integers(1, 50_000))
def test_any_bytes_as_flac_decode_within_the_limit_or_are_refused(body, limit):
    try:
        audio = wire.decode_audio(body, "flac", limit, 16000)
    except wire.BadAudio as exc:
        assert "\n" not in str(exc)
        return
    assert audio.dtype == np.float32 and len(audio) <= limit and np.isfinite(audio).all()


@SLOW
@given(ints=st.lists(st.integers(-(2**15), 2**15 - 1), max_size=4000), limit=st.integers(1, 5000),
       streamed=st.booleans(), cut=st.integers(0, 64))
def test_flac_clips_round_trip_exactly_or_are_refused_when_over_the_limit(ints, limit, streamed, cut):
    """A 16-bit clip as the client encodes it: heard sample for sample, or refused as too long;
    with its header's count zeroed (streamed) or its last bytes cut, heard exactly or refused:
    never longer than the limit, never cut short, never wrong."""
    audio = (np.array(ints, dtype=np.float64) / 2**15).astype(np.float32)
    data, codec = wire.encode_audio(audio, 16000)
    if not ints:
        data, codec = b"", "f32"  # encode_audio gives float32 for an empty clip
    assert codec == ("flac" if ints else "f32")
    if streamed and codec == "flac":
        fields = int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)
        data = data[:18] + fields.to_bytes(8, "big") + data[26:]
    if cut and codec == "flac":
        data = data[:-cut]
    try:
        heard = wire.decode_audio(data, codec, limit, 16000)
    except wire.TooLong:
        event("too long")
        assert len(ints) > limit
        return
    except wire.BadAudio:
        event("refused")
        assert streamed or cut, "an intact clip within the limit must decode"
        return
    event("heard")
    assert len(ints) <= limit and np.array_equal(heard, audio)


@FAST
@given(values=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=300),
       limit=st.integers(1, 400))
def test_float32_clips_round_trip_exactly_unless_too_long_or_not_finite(values, limit):
    """...or not a recording: samples over audio.MAX_PEAK (issue 42: 1e20 overflowed the features)."""
    from specdec_cli.audio import MAX_PEAK

    audio = np.array(values, dtype=np.float32)
    try:
        heard = wire.decode_audio(audio.astype("<f4").tobytes(), "f32", limit, 16000)
    except wire.TooLong:
        assert len(values) > limit
        return
    except wire.BadAudio:
        assert not np.isfinite(audio).all() or np.abs(audio).max() > MAX_PEAK
        return
    assert len(values) <= limit and np.isfinite(audio).all() and (not len(audio) or np.abs(audio).max() <= MAX_PEAK)
    assert np.array_equal(heard, audio)


@pytest.mark.parametrize("codec", ["flac", "f32", "mp3"])
def test_a_truncated_or_misnamed_clip_is_refused_in_one_line(codec):
    audio = (np.arange(-2000, 2000) / 2**15).astype(np.float32)
    data, _ = wire.encode_audio(audio, 16000)
    for body in (data[:3], data[:-1] if codec == "f32" else b"RIFF" + data[4:]):
        with pytest.raises(wire.BadAudio) as refused:
            wire.decode_audio(body, codec, 10_000, 16000)
        assert "\n" not in str(refused.value)
