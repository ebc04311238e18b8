"""A clip is bounded before it is decoded (issue 25): the header is checked first; the decoder
reads at most the longest clip plus one frame, whatever the header says, so a FLAC without a
sample count is judged by its real length and a VBR MP3 without a Xing frame is read to its end,
never cut; a header asking for more samples per second than any recording is refused. Decoding
the file's bytes (a Ray worker's path) follows the same rules. Through a real `specdec` process
where the behaviour is the CLI's.

The oracle for "how much was decoded" is soundfile itself: every read is recorded and the frames
it returned are summed."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from audio_files import flac_with_total, vbr_mp3_without_xing
from cli_helpers import FAST, SR, run_specdec, tone, write_clip

from specdec_cli.audio import audio_suffixes, load_audio
from specdec_cli.errors import InputError

MAX_S = 30.0
LIMIT = int(MAX_S * SR)
needs_mp3 = pytest.mark.skipif(".mp3" not in audio_suffixes(), reason="libsndfile without MP3")


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """Frames each soundfile read returned, in order (every decoding path reads through it)."""
    reads: list[int] = []
    real = sf.SoundFile.read

    def read(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        reads.append(len(out))
        return out

    monkeypatch.setattr(sf.SoundFile, "read", read)
    return reads


def test_a_flac_without_a_sample_count_is_read_under_the_bound_and_accepted_by_its_length(tmp_path, decoded):
    """Today: refused as '576460752303423.5 s long' (libsndfile's 'unknown' taken for a length)."""
    path = tmp_path / "stream.flac"
    sf.write(str(path), tone(2.0), SR, format="FLAC", subtype="PCM_16")
    expected = load_audio(path, SR, MAX_S)
    path.write_bytes(flac_with_total(path.read_bytes(), 0))
    assert sf.info(str(path)).frames == 2**63 - 1  # libsndfile's "unknown" (SF_COUNT_MAX)
    np.testing.assert_array_equal(load_audio(path, SR, MAX_S), expected)
    assert max(decoded) == 2 * SR


def test_a_long_flac_without_a_count_is_refused_after_the_limit_plus_one_frame(tmp_path, decoded):
    """The decompression bomb for the CLI: 10 min of a constant is a few kB of FLAC (1 h decoded
    whole: 1.4 s and +220 MB, measured in the issue's report). Only 30 s + 1 frame is decoded."""
    path = tmp_path / "long.flac"
    with sf.SoundFile(str(path), "w", SR, 1, "PCM_16", format="FLAC") as f:
        block = np.full(SR * 60, 1e-3, dtype=np.float32)
        for _ in range(10):
            f.write(block)
    path.write_bytes(flac_with_total(path.read_bytes(), 0))
    with pytest.raises(InputError) as info:
        load_audio(path, SR, MAX_S)
    assert info.value.message == (f"{path} is over 30 s long; the model takes at most 30 s per clip: add "
                                  "--segment to cut it at pauses into segments of at most 30 s")
    assert sum(decoded) == LIMIT + 1


def test_a_long_file_with_an_honest_header_is_refused_before_any_decoding(tmp_path, decoded):
    path = write_clip(tmp_path / "long.flac", seconds=3600, sr=1000)
    with pytest.raises(InputError) as info:
        load_audio(path, SR, MAX_S)
    assert "is 3600.0 s long" in info.value.message
    assert decoded == []


def test_the_clips_bytes_are_bounded_as_the_file_is(tmp_path, decoded):
    """A Ray worker decodes the bytes its driver read: 40 s, no count in the header."""
    path = tmp_path / "shipped.flac"
    sf.write(str(path), tone(40.0), SR, format="FLAC", subtype="PCM_16")
    path.write_bytes(flac_with_total(path.read_bytes(), 0))
    with pytest.raises(InputError) as info:
        load_audio(tmp_path / "elsewhere.flac", SR, MAX_S, data=path.read_bytes())
    assert "is over 30 s long" in info.value.message and sum(decoded) == LIMIT + 1


@needs_mp3
def test_a_vbr_mp3_without_its_xing_frame_is_read_to_its_end(tmp_path):
    """Today: 15 s of audio read as 3.8 s (libmpg123's estimate from the first, loud frame),
    silently. The oracle: the same MP3 with its Xing frame, whose count is exact."""
    path = vbr_mp3_without_xing(tmp_path / "vbr.mp3", seconds_loud=3, seconds_quiet=12)
    estimate = sf.info(str(path)).frames / SR
    assert estimate < 5  # the header under-reports: what used to cut the clip
    got = load_audio(path, SR, MAX_S)
    assert abs(len(got) / SR - 15.0) < 0.2  # the whole clip (an MP3 pads up to a frame at each end)


@needs_mp3
def test_a_vbr_mp3_without_its_xing_frame_over_the_limit_is_refused(tmp_path, decoded):
    """Today: accepted as its first ~4 s. Its estimate says it fits; it does not."""
    path = vbr_mp3_without_xing(tmp_path / "long.mp3", seconds_loud=3, seconds_quiet=40)
    assert sf.info(str(path)).frames / SR < MAX_S
    with pytest.raises(InputError) as info:
        load_audio(path, SR, MAX_S)
    assert "is over 30 s long" in info.value.message and sum(decoded) <= LIMIT + 1


@needs_mp3
def test_an_mp3_with_its_xing_frame_decodes_as_before(tmp_path):
    """An MP3 with a length header is read as soundfile reads it whole: same samples."""
    path = tmp_path / "cbr.mp3"
    sf.write(str(path), tone(1.5), SR, format="MP3")
    whole, rate = sf.read(str(path), dtype="float32")
    assert rate == SR
    np.testing.assert_array_equal(load_audio(path, SR, MAX_S), whole)


def test_more_samples_per_second_than_any_recording_is_refused_from_the_header(tmp_path, decoded):
    """8 channels at 192 kHz: 30 s of it would be 46M samples before the first check. Today accepted."""
    path = tmp_path / "wide.wav"
    sf.write(str(path), np.tile(tone(0.2, sr=192000)[:, None], (1, 8)), 192000, subtype="PCM_16")
    with pytest.raises(InputError) as info:
        load_audio(path, SR, MAX_S)
    assert info.value.message == (f"{path} holds 8 channels at 192000 Hz, over the 768,000 samples per second "
                                  "specdec decodes; downmix or resample it (the model hears 16 kHz mono)")
    assert decoded == []
    sf.write(str(path), tone(0.2, sr=192000), 192000, subtype="PCM_16")  # mono at 192 kHz is fine
    assert len(load_audio(path, SR, MAX_S)) == int(0.2 * SR)


@pytest.mark.spawns
def test_the_cli_describes_a_streamed_flac_and_refuses_a_streamed_bomb(tmp_path):
    """Through a real `specdec`: a FLAC with no count is described (today: exit 2, '576460752303423.5
    s long'); one holding 40 s is refused in one line, exit 2, no traceback."""
    ok = tmp_path / "ok.flac"
    sf.write(str(ok), tone(1.0), SR, format="FLAC", subtype="PCM_16")
    ok.write_bytes(flac_with_total(ok.read_bytes(), 0))
    done = run_specdec("--threads", "1", "describe", str(ok), *FAST, "--no-live")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    bomb = tmp_path / "bomb.flac"
    sf.write(str(bomb), tone(40.0), SR, format="FLAC", subtype="PCM_16")
    bomb.write_bytes(flac_with_total(bomb.read_bytes(), 0))
    refused = run_specdec("--threads", "1", "describe", str(bomb), *FAST, "--no-live")
    assert refused.returncode == 2
    assert refused.stderr == (f"error: {bomb} is over 30 s long; the model takes at most 30 s per clip: add "
                              "--segment to cut it at pauses into segments of at most 30 s\n")


@pytest.mark.parametrize("name", ["mallory.m4a", "mallory.wav", "mallory.flac", "sub/mallory.m4a"])
def test_a_file_that_names_another_file_is_not_decoded_as_that_file(tmp_path, name):
    """Issue 42: a 43-byte text file `ffconcat version 1.0 / file alice_private.wav` was decoded
    through PyAV's concat demuxer as Alice's clip (under .m4a, .wav and .flac names, in subfolders).
    PyAV now opens only the demuxers of one recording (ffmpeg's format_whitelist): refused in one
    line, from the path and from the bytes. The control: Alice's own file and a real m4a decode."""
    mallory = tmp_path / name
    alice = write_clip(mallory.parent / "alice_private.wav", 2.0)
    mallory.write_text("ffconcat version 1.0\nfile alice_private.wav\n")
    assert load_audio(alice, SR, MAX_S).shape == (2 * SR,)  # the control
    for data in (None, mallory.read_bytes()):
        with pytest.raises(InputError) as refused:
            load_audio(mallory, SR, MAX_S, data=data)
        assert "cannot decode" in str(refused.value) and "\n" not in str(refused.value)


def test_an_m4a_still_decodes_through_pyav(tmp_path):
    """The allowlist's control: a real AAC-in-MP4 clip (what phones record) decodes, by path and bytes."""
    av = pytest.importorskip("av")
    clip = tmp_path / "real.m4a"
    with av.open(str(clip), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=SR)
        frame = av.AudioFrame.from_ndarray(tone(1.0)[None].astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = SR
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    for data in (None, clip.read_bytes()):
        assert abs(load_audio(clip, SR, MAX_S, data=data).shape[0] - SR) < SR // 4


@pytest.mark.spawns
def test_huge_finite_samples_are_refused_in_one_line(tmp_path):
    """Issue 42: a float WAV of 1e20 samples (finite, so past the NaN check) overflowed the features:
    `describe --sample` printed `unexpected IndexError`, without --sample a description of `$$$…`.
    Refused now, before the model, in one line; int16's scale in a float file (±32768) still passes
    (read as 16-bit PCM since issue 52: tests/test_scale_check.py)."""
    huge = tmp_path / "huge.wav"
    sf.write(str(huge), np.full(SR, 1e20, np.float32), SR, subtype="FLOAT")
    with pytest.raises(InputError, match=r"holds samples up to 1e\+20, over 100000 times full scale"):
        load_audio(huge, SR, MAX_S)
    loud = tmp_path / "int16_scale.wav"
    sf.write(str(loud), tone(1.0) * 32768, SR, subtype="FLOAT")
    assert load_audio(loud, SR, MAX_S).shape == (SR,)  # the control
    done = run_specdec("--threads", "1", "describe", str(huge), *FAST, "--sample", "--no-live")
    assert done.returncode != 0 and done.stdout == "", (done.returncode, done.stdout)
    assert done.stderr.count("\n") == 1 and "times full scale" in done.stderr and "unexpected" not in done.stderr


def test_a_wav_at_1_hz_is_refused_from_its_header(tmp_path):
    """Issue 42: a 104-byte WAV at 1 Hz became a 30 s clip (21 s of CPU, 358 MB to resample), with
    only a warning. Refused from its header now, before decoding; 8 kHz (telephone) is the control."""
    tiny = tmp_path / "one_hz.wav"
    sf.write(str(tiny), tone(30, sr=1), 1)
    assert tiny.stat().st_size < 200
    with pytest.raises(InputError, match=r"is at 1 Hz, fewer samples per second than any speech recording"):
        load_audio(tiny, SR, MAX_S)
    assert load_audio(write_clip(tmp_path / "phone.wav", 1.0, sr=8000), SR, MAX_S).shape == (SR,)


def test_a_flac_whose_body_holds_far_more_than_its_header_says_is_refused(tmp_path):
    """Issue 42: a FLAC whose header says 2 s over a 2-hour body loaded as 2 s with no word. Here a
    header saying 1 s over 20 s of noise (the body cannot hold only 1 s): refused from its header
    and size, by path and by bytes. The control: the same file with its true count, and a FLAC
    with a large metadata block (a cover picture) over a short body."""
    rng = np.random.default_rng(0)
    honest = tmp_path / "honest.flac"
    sf.write(str(honest), (0.3 * rng.standard_normal(20 * SR)).astype(np.float32), SR, format="FLAC")
    altered = tmp_path / "altered.flac"
    altered.write_bytes(flac_with_total(honest.read_bytes(), SR))
    for data in (None, altered.read_bytes()):
        with pytest.raises(InputError, match=r"its header says 1\.00 s, but it holds [\d,]+ bytes of audio"):
            load_audio(altered, SR, MAX_S, data=data)
    assert load_audio(honest, SR, MAX_S).shape == (20 * SR,)
    short = tmp_path / "short.flac"
    sf.write(str(short), tone(1.0), SR, format="FLAC")
    b = short.read_bytes()
    picture = bytes([0x06 | (b[4] & 0x80)]) + (300_000).to_bytes(3, "big") + bytes(300_000)  # a PICTURE block
    pictured = tmp_path / "pictured.flac"
    pictured.write_bytes(b[:4] + bytes([b[4] & 0x7F]) + b[5:8 + int.from_bytes(b[5:8], "big")] + picture
                         + b[8 + int.from_bytes(b[5:8], "big"):])
    assert load_audio(pictured, SR, MAX_S).shape == (SR,)
