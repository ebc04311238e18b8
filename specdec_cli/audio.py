"""Read one clip from disk, refuse what the model cannot use, return mono float32 at its rate.

soundfile decodes (WAV in any PCM/float width, FLAC, OGG, MP3 where libsndfile has it); soxr
resamples. A clip is bounded before it is decoded: the header's length is checked first, then the
decoder reads at most the longest clip plus one frame, as a forward stream, so a header that does not
say the length (a FLAC written to a pipe) or under-reports it (a VBR MP3 without its Xing frame) is
read under the same bound and judged by its real length, never cut. numpy, soundfile and soxr are
imported when a clip is read, not with the module: the CLI checks paths before paying for them, and
soxr only when a clip's rate differs from the model's. Each refusal is an InputError whose one line
says what is wrong and what to do. Loudness is never normalised: volume is one of the attributes the
model describes.

A recording longer than the model's window is refused unless the caller asks for it in segments
(`--segment`, segments.py): `recording_info` and `mono_blocks` read it under their own, explicit
bound (MAX_RECORDING_SECONDS) as a forward stream of mono blocks, so memory stays at one block
whatever the file's length, and the normal path's bound above is untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InputError, TooLong, printable

if TYPE_CHECKING:
    import numpy as np

MIN_SECONDS = 0.1
# Below this peak a clip carries no speech to describe. Real quiet speech ("音量较小" in the demo
# corpus, espeak amplitude 25) peaks some 30 dB above it, so only true silence or dither is refused.
SILENCE_DBFS = -60.0
# Above this peak samples are not a recording (full scale is 1.0; a float file written with int16's
# scale, ±32768, still passes): 1e20 or 3e38, finite, overflowed the features' float32 power spectrum
# and reached the model as inf/NaN (issue 42). The server refuses such a clip too (wire.decode_audio).
MAX_PEAK = 1e5

# Float samples over full scale (1.0), issue 52. Up to OVER_SCALE (+6 dB) they are what a lossy
# decoder or a float mix overshoots by: heard as they are. From INT16_SCALED on (48 dB over, the
# quietest speech a 16-bit recording holds) a float file was written at 16-bit integers' scale (a
# common export mistake, ±32767): read as 16-bit PCM would be, divided by 32768, with a note. Between
# the two, and past 16-bit's range, there is no scale to read them at: refused with the fix.
OVER_SCALE = 2.0
INT16_SCALED = 256.0
# A lossy codec's decoder (MP3, Vorbis, Opus; anything PyAV decodes) reconstructs the waveform from
# its spectrum and overshoots full scale by more than +6 dB on loud, clipped or noisy passages (a
# VBR MP3 of full-scale noise decodes to 2.04): never a 16-bit-scale export, heard as it is up to
# INT16_SCALED. Only PCM and float files (WAV, FLAC, AIFF...) get the OVER_SCALE cut.
LOSSY_SUBTYPES = frozenset({"MPEG_LAYER_I", "MPEG_LAYER_II", "MPEG_LAYER_III", "VORBIS", "OPUS"})
INT16_FULL = 32768.0


class RescaledClip(UserWarning):
    """A float clip written at 16-bit integers' scale, read as 16-bit PCM (divided by 32768)."""


# Fewer samples per second than any recording of speech carries (telephone audio is 8 kHz): a
# 104-byte WAV at 1 Hz was otherwise resampled into a 30 s clip (21 s of CPU, 358 MB), with only a
# warning (issue 42). At 1 kHz and above, resampling to 16 kHz costs at most 16 samples per sample read.
MIN_RATE = 1000

# Decoded samples per second of audio at most (rate x channels: 384 kHz stereo, 96 kHz 7.1): with the
# length limit, what one clip may cost to decode (30 s: 23M float32 samples, 92 MB) whatever its header.
MAX_SAMPLES_PER_SECOND = 768_000
# libsndfile's frame count for a stream whose header does not say its length (SF_COUNT_MAX).
UNKNOWN_FRAMES = 2**63 - 1

# --segment reads a recording whole, up to this: what one file may cost in decoding time and records
# (4 h of a 30 s window is at most 480 segments). Memory does not grow with it: the recording is read
# as a stream of blocks (mono_blocks), never held whole.
MAX_RECORDING_SECONDS = 4 * 3600.0
# Frames per block of that stream (at most 2 s of a 384 kHz stereo file: 6 MB of float32).
BLOCK_FRAMES = 1 << 18

# libsndfile format name -> file suffixes we accept for it.
_FORMAT_SUFFIXES = {"WAV": (".wav",), "FLAC": (".flac",), "OGG": (".ogg",), "MP3": (".mp3",)}


def audio_suffixes() -> tuple[str, ...]:
    """Suffixes of the formats the installed libsndfile decodes (MP3 needs libsndfile >= 1.1)."""
    import soundfile as sf

    available = sf.available_formats()
    return tuple(s for fmt, suffixes in _FORMAT_SUFFIXES.items() if fmt in available for s in suffixes)


def _formats_hint() -> str:
    names = [s.lstrip(".").upper() for s in audio_suffixes()]
    if _has_av():
        names.append("M4A")  # and whatever else ffmpeg decodes (AAC, WMA, WebM, ...): PyAV below
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


@functools.cache
def _has_av() -> bool:
    import importlib.util

    return importlib.util.find_spec("av") is not None


def _reason(exc: Exception) -> str:
    """libsndfile's own words, e.g. 'Format not recognised', without the path it repeats."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ")[-1].rstrip(".")


def check_path(path: Path) -> None:
    """The cheap checks, done before any model is loaded: the path names a non-empty file."""
    # One stat for every check: Path.is_dir/exists re-raise errors other than "no such file" (a name
    # too long, a folder without search permission), which must be one line too, not a traceback.
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(f"no such file: {path}; check the path") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(info.st_mode):
        # The suggested command must work as typed: batch needs --out.
        raise InputError(f"{path} is a directory; give one audio file (use `specdec batch {path} --out "
                         "results.jsonl` for a folder)")
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block the decoder; a device (/dev/zero) never ends
        raise InputError(f"{path} is {_kind(info.st_mode)}, not a file; give an audio file")
    if info.st_size == 0:
        raise InputError(f"{path} is empty (0 bytes); give a {_formats_hint()} file")
    if not os.access(path, os.R_OK):
        raise InputError(f"cannot read {path}: permission denied")


def _kind(mode: int) -> str:
    """What a path that is not a regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def probe(path: Path) -> None:
    """Every check a clip passes before any model loads: the path names a non-empty, readable,
    regular file whose header the decoder reads and whose format specdec decodes. What the header
    cannot tell (a damaged body, silence, the real length) is found when the clip is read."""
    _check_format(_opened(path, None), path)


def header_rate(path: Path, data: bytes | None = None) -> int:
    """The sampling rate a readable clip's header states (libsndfile's, else ffmpeg's through PyAV)."""
    return int(_info(path, data).samplerate)


def _source(path: Path, data: bytes | None):
    """What soundfile reads: the file, or the clip's bytes (a fresh stream per read)."""
    import io

    return str(path) if data is None else io.BytesIO(data)


def _info(path: Path, data: bytes | None = None):  # -> soundfile's info record, or an AvInfo
    import soundfile as sf

    try:
        return sf.info(_source(path, data))
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        found = _av_info(path, data)  # what libsndfile does not read (m4a/AAC, WMA, WebM, ...): ffmpeg's
        if found is not None:
            return found
        raise InputError(f"cannot decode {path} as audio ({_reason(exc)}); give a {_formats_hint()} file") from exc


# -- what libsndfile does not read: PyAV (ffmpeg's decoders, bundled in its wheels) ---------------------
#
# Why PyAV and not librosa/audioread over an apt ffmpeg (measured here, docs/usage.md "Formats"): the
# av 18.1.0 wheel is 36 MB (104 MB installed, ffmpeg's libraries inside) and needs nothing from apt,
# where ffmpeg from Debian is 101 packages and 293 MB installed; PyAV decodes in this process, forward,
# frame by frame, so the same bound as libsndfile's reads applies (at most the window + 1 frame, never
# the whole file), where audioread pipes a whole ffmpeg subprocess per clip. Formats libsndfile reads
# stay on libsndfile (its decoders are what the tests and the docs' figures were made with).

# The demuxers PyAV may use, as ffmpeg's own `format_whitelist` (issue 42): containers of one audio
# recording. Never one that reads other files or URLs it names (concat/ffconcat, HLS, DASH, image2,
# tee, playlists): a 43-byte text file `ffconcat version 1.0 / file alice.wav` under any suffix was
# otherwise decoded as the file it names, and described as that file.
AV_DEMUXERS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,asf,ogg,aac,mp3,wav,flac,aiff,caf,amr,au,w64"
_AV_OPTIONS = {"format_whitelist": AV_DEMUXERS, "protocol_whitelist": "file"}


@dataclasses.dataclass(frozen=True)
class AvInfo:
    """What PyAV's container says about a clip's first audio stream, shaped as soundfile's info."""

    frames: int         # UNKNOWN_FRAMES when the container states no duration
    samplerate: int
    channels: int
    format: str         # "FFMPEG:<container>/<codec>"


def _av_source(path: Path, data: bytes | None):
    import io

    return str(path) if data is None else io.BytesIO(data)


def _av_info(path: Path, data: bytes | None) -> AvInfo | None:
    """The clip's audio as ffmpeg sees it, or None: PyAV not installed, or not audio it decodes."""
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(_av_source(path, data), "r", options=_AV_OPTIONS) as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            rate, channels = int(stream.rate or 0), int(stream.channels or 0)
            seconds = (float(stream.duration * stream.time_base) if stream.duration and stream.time_base else
                       container.duration / 1_000_000 if container.duration else None)
            frames = UNKNOWN_FRAMES if seconds is None else round(seconds * rate)
            return AvInfo(frames, rate, channels, f"FFMPEG:{container.format.name}/{stream.codec_context.name}")
    except Exception:  # any failure to probe (FFmpegError, a stream without a rate: AttributeError, ...)
        return None     # is "not audio ffmpeg decodes": libsndfile's reason is then the one given


class _AvStream:
    """A clip decoded by PyAV as a forward stream with SoundFile's `read(frames, dtype, always_2d)`:
    each decoded frame converted to packed float32 (av.AudioResampler, rate and layout kept), at
    most what is asked held beyond it."""

    def __init__(self, path: Path, data: bytes | None, channels: int) -> None:
        import av

        self._container = av.open(_av_source(path, data), "r", options=_AV_OPTIONS)
        self._frames = self._container.decode(self._container.streams.audio[0])
        self._to_float = av.AudioResampler(format="flt")
        self._channels = channels
        self._held: list[np.ndarray] = []
        self._count = 0

    def _more(self) -> bool:
        import numpy as np

        frame = next(self._frames, None)
        if frame is None:
            return False
        for out in self._to_float.resample(frame):
            block = np.asarray(out.to_ndarray(), dtype=np.float32).reshape(-1, self._channels)
            self._held.append(block)
            self._count += block.shape[0]
        return True

    def read(self, frames: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        import numpy as np

        while self._count < frames and self._more():
            pass
        data = np.concatenate(self._held) if self._held else np.zeros((0, self._channels), dtype=np.float32)
        out, rest = data[:frames], data[frames:]
        self._held, self._count = ([rest] if len(rest) else []), len(rest)
        return out

    def close(self) -> None:
        self._container.close()


def load_audio(path: str | Path, sampling_rate: int, max_seconds: float, data: bytes | None = None,
               too_long_hint: str | None = None) -> np.ndarray:
    """The clip at `path` as mono float32 at `sampling_rate`, after validation (see module doc).
    With `data`, the clip is those bytes (the file's content, read elsewhere: a Ray driver ships
    them to workers that cannot see its disk) and `path` only names it in messages.
    `too_long_hint`: what to do with a clip over the window, in the caller's terms (None: the
    command line's, segment_hint)."""
    path = Path(path)
    info = _opened(path, data)
    limit = _check_header(info, path, max_seconds, data, too_long_hint)
    try:
        samples = _decode(path, data, info, limit)
    except InputError:
        raise
    except Exception as exc:  # a decoder's failure on a damaged file, whatever its type: one line
        raise InputError(f"cannot decode {path} as audio ({_reason(exc)}); give a {_formats_hint()} file") from exc
    if samples.shape[0] > limit:
        raise TooLong(f"{path} is over {max_seconds:g} s long; the model takes at most {max_seconds:g} s "
                         f"per clip: {too_long_hint or segment_hint(max_seconds)}")
    _warn_if_short(path, data, info, samples.shape[0])
    return _checked(samples, info.samplerate, sampling_rate, max_seconds, path, too_long_hint, lossy=_lossy(info))


def _lossy(info) -> bool:
    """Whether the clip was decoded from a lossy codec (see LOSSY_SUBTYPES)."""
    return isinstance(info, AvInfo) or getattr(info, "subtype", "") in LOSSY_SUBTYPES


class TruncatedClip(UserWarning):
    """A clip holds less audio than its header says (a copy cut short, a recorder that died): it is
    described as it is, and said so."""


# A WAV data size meaning "unknown length" (written to a pipe): no claim to hold the file to.
_UNKNOWN_WAV_BYTES = 0xFFFFFFFF


def _claimed_frames(path: Path, data: bytes | None, info) -> int | None:
    """The frames a PCM WAV header claims, as written (libsndfile clamps its count to what the file
    holds, so it cannot tell a cut file from a whole one; the stdlib's wave reader gives the
    header's own count). None for other formats, or a header that states no length."""
    if info.format != "WAV":
        return None
    import io
    import wave

    try:
        with wave.open(io.BytesIO(data) if data is not None else str(path), "rb") as w:
            frames, width = w.getnframes(), w.getsampwidth() * w.getnchannels()
    except (wave.Error, EOFError, OSError):
        return None  # float or extensible WAV (wave reads PCM only): no claim checked
    if width <= 0 or frames * width >= _UNKNOWN_WAV_BYTES - width or frames == 0:
        return None
    return frames


def _warn_if_short(path: Path, data: bytes | None, info, frames: int) -> None:
    """One line when the clip holds less than its header claims: the length claimed and the length read."""
    import warnings

    claimed = _claimed_frames(path, data, info)
    if claimed is not None and claimed > frames:
        rate = info.samplerate
        warnings.warn(TruncatedClip(f"{printable(str(path))} is cut short: its header says {claimed / rate:.2f} s, "
                                    f"the file holds {frames / rate:.2f} s; described as it is"), stacklevel=3)


def _opened(path: Path, data: bytes | None):  # -> soundfile's info record, the file known readable
    if data is None:
        check_path(path)
    elif not data:
        raise InputError(f"{path} is empty (0 bytes); give a {_formats_hint()} file")
    return _info(path, data)


def segment_hint(max_seconds: float) -> str:
    """What to do with a clip over the window: the option that describes it in segments."""
    return f"add --segment to cut it at pauses into segments of at most {max_seconds:g} s"


def _check_format(info, path: Path) -> None:
    rate, channels = info.samplerate, info.channels
    if rate <= 0 or channels <= 0:
        raise InputError(f"cannot decode {path} as audio (its header gives {rate} Hz, {channels} channels); "
                         f"give a {_formats_hint()} file")
    if rate < MIN_RATE:
        raise InputError(f"{path} is at {rate} Hz, fewer samples per second than any speech recording "
                         f"(at least {MIN_RATE} Hz; telephone audio is 8000): give the recording itself")
    if rate * channels > MAX_SAMPLES_PER_SECOND:
        raise InputError(f"{path} holds {channels} channels at {rate} Hz, over the {MAX_SAMPLES_PER_SECOND:,} "
                         "samples per second specdec decodes; downmix or resample it (the model hears 16 kHz mono)")


def _stated_seconds(info) -> float | None:
    """The length the header states, when it can be trusted before decoding: not a stream's (no
    count), nor an MP3's (without a Xing frame it is an estimate from the first frame's bitrate)."""
    if info.frames == UNKNOWN_FRAMES or info.format == "MP3":
        return None
    return info.frames / info.samplerate


def _check_header(info, path: Path, max_seconds: float, data: bytes | None = None,
                  too_long_hint: str | None = None) -> int:
    """What the header says, checked before anything is decoded; the most frames the clip may hold."""
    _check_format(info, path)
    rate = info.samplerate
    # The header tells the length before anything is decoded, so a 2-hour file is refused at once.
    stated = _stated_seconds(info)
    if stated is not None and stated > max_seconds:
        raise TooLong(f"{path} is {info.frames / rate:.1f} s long; the model takes at most "
                         f"{max_seconds:g} s per clip: {too_long_hint or segment_hint(max_seconds)}")
    if stated is not None and info.format == "FLAC":
        _check_flac_body(path, data, info)
    return math.floor(max_seconds * rate)


def _flac_audio_bytes(path: Path, data: bytes | None) -> int | None:
    """Bytes of a FLAC file after its metadata blocks (its audio frames), or None when the
    metadata cannot be walked. By hand: the FLAC format's block headers (1 byte: last-block flag
    and type, 3 bytes: length); libsndfile does not say where the audio starts."""
    import io

    with (io.BytesIO(data) if data is not None else open(path, "rb")) as f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        if f.read(4) != b"fLaC":
            return None
        while True:
            head = f.read(4)
            if len(head) < 4:
                return None
            at = f.seek(int.from_bytes(head[1:], "big"), io.SEEK_CUR)
            if head[0] & 0x80:  # the last metadata block
                return max(0, size - at)


def _check_flac_body(path: Path, data: bytes | None, info) -> None:
    """Refuse a FLAC whose audio frames hold far more than its header's sample count could take
    (issue 42: a header saying 2 s over a 2-hour body loaded as 2 s, with no word): at most 4 bytes
    a sample (FLAC never exceeds its verbatim encoding) plus a byte a sample of frame headers."""
    body = _flac_audio_bytes(path, data)
    if body is None:
        return
    most = info.frames * info.channels * 4 + info.frames + 65536
    if body > most:
        raise InputError(f"{path}: its header says {info.frames / info.samplerate:.2f} s, but it holds "
                         f"{body:,} bytes of audio, more than that can take (a damaged or altered file); "
                         "re-export it")


def _decode(path: Path, data: bytes | None, info, limit: int) -> np.ndarray:
    """At most `limit` + 1 frames, [frames, channels] float32, read as a forward stream: never
    capped at (or sized by) the header's count, so the caller sees the clip's real length up to the
    bound. An MP3 without a length header goes through a pipe: libsndfile then reads it to its end
    (given the file, it stops at its estimate, silently cutting a VBR MP3)."""
    with _forward(path, data, info) as f:
        return f.read(limit + 1, dtype="float32", always_2d=True)


@contextlib.contextmanager
def _forward(path: Path, data: bytes | None, info) -> Iterator:
    """The clip opened as a forward stream (see _decode)."""
    import soundfile as sf

    if isinstance(info, AvInfo):
        import av

        try:
            stream = _AvStream(path, data, info.channels)
        except (av.FFmpegError, AttributeError, ValueError) as exc:
            raise InputError(f"cannot decode {path} as audio ({exc}); give a {_formats_hint()} file") from exc
        try:
            yield stream
        finally:
            stream.close()
        return
    if info.format == "MP3":
        with _mp3_pipe(path, data) as stream:
            if stream.frames == UNKNOWN_FRAMES:
                yield stream
                return
    with _forward_only(sf)(_source(path, data)) as f:
        if sf.SoundFile.seekable(f):
            f.seek(0)  # as soundfile.read does: libmpg123's first samples differ without it
        yield f


@functools.cache
def _forward_only(sf):  # -> a SoundFile class (soundfile is imported with the first clip)
    class ForwardOnly(sf.SoundFile):
        """A SoundFile read as a stream. soundfile caps a seekable file's reads at the header's
        frame count and seeks after each read, which fails at the end of a FLAC whose header has
        no count; a stream is read until the decoder stops, `frames` at most."""

        def seekable(self) -> bool:
            return False

    return ForwardOnly


@contextlib.contextmanager
def _mp3_pipe(path: Path, data: bytes | None):
    """The MP3 opened on a pipe that a thread fills from the file (or the bytes): libmpg123 then
    decodes forward, and the frame count is unknown unless a Xing/Info/VBRI frame gives it. No
    maintained Python decoder reads such an MP3 to its end without ffmpeg; libsndfile does, given a
    pipe (its documented stream input)."""
    import soundfile as sf

    read_end, write_end = os.pipe()

    def feed() -> None:
        try:
            with open(write_end, "wb") as out:
                if data is not None:
                    out.write(data)
                    return
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 16):
                        out.write(chunk)
        except OSError:
            pass  # BrokenPipeError: the reader has what it needs and closed its end

    feeder = threading.Thread(target=feed, daemon=True, name="specdec-mp3-feed")
    feeder.start()
    try:
        with sf.SoundFile(read_end, closefd=False) as stream:
            yield stream
    finally:
        os.close(read_end)
        feeder.join()


def _checked(data: np.ndarray, rate: int, sampling_rate: int, max_seconds: float, path: Path,
             too_long_hint: str | None = None, lossy: bool = False) -> np.ndarray:
    """`too_long_hint`: what to do with a clip over the window, in the caller's terms (None: the
    command line's, segment_hint). `lossy`: decoded from a lossy codec (see LOSSY_SUBTYPES)."""
    import numpy as np

    seconds = data.shape[0] / rate
    if data.shape[0] == 0:
        raise InputError(f"{path} holds no audio samples; give a clip of at least {MIN_SECONDS:g} s")
    if seconds < MIN_SECONDS:
        raise InputError(f"{path} is {seconds:.3f} s long; give a clip of at least {MIN_SECONDS:g} s")
    if seconds > max_seconds:  # headers of some compressed files under-report the length
        raise TooLong(f"{path} is {seconds:.1f} s long; the model takes at most {max_seconds:g} s "
                         f"per clip: {too_long_hint or segment_hint(max_seconds)}")
    if not np.isfinite(data).all():
        raise InputError(f"{path} contains NaN or infinite samples; re-export the audio")
    return _prepare(_at_full_scale(data, path, lossy), rate, sampling_rate, path)


def _over_scale(path: Path | str, peak: float) -> InputError:
    return InputError(f"{path} holds samples up to {peak:.4g}, far over full scale (1.0), at no scale specdec "
                      "can read; re-export it as 16-bit PCM or as float at full scale 1.0")


def _at_full_scale(data: np.ndarray, path: Path | str, lossy: bool = False) -> np.ndarray:
    """`data` at full scale 1.0: as it is up to OVER_SCALE (INT16_SCALED when `lossy`); divided by
    32768, with a note, when it was written at 16-bit's scale; else refused (see OVER_SCALE)."""
    import warnings

    import numpy as np

    peak = float(np.abs(data).max()) if data.size else 0.0
    if peak <= (INT16_SCALED if lossy else OVER_SCALE) or peak > MAX_PEAK:  # over MAX_PEAK: prepare_mono's
        return data
    if not INT16_SCALED <= peak <= INT16_FULL:
        raise _over_scale(path, peak)
    warnings.warn(RescaledClip(f"{printable(str(path))} holds float samples up to {peak:.0f}, at 16-bit's scale "
                               "instead of 1.0: read as 16-bit PCM (divided by 32768); re-export it at full "
                               "scale 1.0 to silence this"), stacklevel=4)
    return (data / INT16_FULL).astype(np.float32)


class ChannelsDiffer(UserWarning):
    """A clip whose channels differ much (two voices, or one channel silent): mixed to mono anyway."""


# The channels differ much when what sets each apart from their mean holds at least half the mean's
# power: for two channels of equal level, a correlation of 1/3 or less (two voices: about 0; one
# voice through two microphones: well above). One channel silent gives 1; a panned copy, near 0.
CHANNELS_DIFFER = 0.5


def channels_differ(data: np.ndarray) -> bool:
    """Whether the channels of `data` ([frames, channels]) differ much (see CHANNELS_DIFFER)."""
    import numpy as np

    if data.ndim != 2 or data.shape[1] < 2 or not data.size:
        return False
    mean = data.mean(axis=1, keepdims=True, dtype=np.float64)
    apart = float(np.mean(np.square(data - mean)))
    return apart > 0 and apart >= CHANNELS_DIFFER * float(np.mean(np.square(mean)))


def _note_channels(data: np.ndarray, path: Path | str) -> None:
    import warnings

    if channels_differ(data):
        warnings.warn(ChannelsDiffer(f"{printable(str(path))}: its {data.shape[1]} channels differ much (two voices, "
                                     "or one channel silent?); they are mixed to mono, as the models hear one "
                                     "voice: save each channel as a file of its own to describe it alone"),
                      stacklevel=4)


def _mono(data: np.ndarray) -> np.ndarray:
    # The mean of the channels, as the model hears them: what librosa.to_mono computes (tested
    # against it), without importing librosa for every clip.
    return data[:, 0] if data.shape[1] == 1 else data.mean(axis=1)


def _prepare(data: np.ndarray, rate: int, sampling_rate: int, path: Path) -> np.ndarray:
    _note_channels(data, path)
    return prepare_mono(_mono(data), rate, sampling_rate, path)


def prepare_mono(mono: np.ndarray, rate: int, sampling_rate: int, path: Path | str) -> np.ndarray:
    """Mono samples at `rate` as the model hears them (at `sampling_rate`), refused when silent: a
    clip's last step, and each segment's (segments.py)."""
    import numpy as np

    peak = float(np.abs(mono).max())
    if peak > MAX_PEAK:
        raise _not_a_recording(path, peak)
    if peak < 10 ** (SILENCE_DBFS / 20):
        raise InputError(f"{path} is silent (peak below {SILENCE_DBFS:g} dBFS); nothing to describe: "
                         "check the recording")
    if rate != sampling_rate:
        mono = resample(mono, rate, sampling_rate)
    return np.ascontiguousarray(mono, dtype=np.float32)


def resample(mono: np.ndarray, rate: int, sampling_rate: int) -> np.ndarray:
    """`mono` at `rate` Hz, resampled to `sampling_rate` Hz: what librosa.resample's default
    (res_type="soxr_hq", fix=True) returns, without librosa. Through librosa the first clip that is
    not at the model's rate paid numba compiling librosa's jitted helpers (19-53 s once per machine,
    ~2 s a process after: issue 44, bench/resample.py); soxr is the same resampler with no JIT."""
    import numpy as np
    import soxr  # lazy, a C extension: imported in ~0.1 s, only when a clip needs resampling

    out = soxr.resample(mono, rate, sampling_rate, quality="soxr_hq")
    # librosa's length (fix=True): ceil(n x ratio) samples, soxr's output cut or zero-padded to it.
    size = math.ceil(mono.shape[0] * (sampling_rate / rate))  # librosa's float order, to the sample
    return out[:size] if out.shape[0] >= size else np.pad(out, (0, size - out.shape[0]))


# A [channels, frames] array (librosa's and torchaudio's layout) is told from [frames, channels] by
# its first axis: at most this many channels (7.1 is 8) with more frames than channels on the other.
MAX_CHANNELS_FIRST = 8


def prepare_waveform(samples: np.ndarray, rate: int, sampling_rate: int, max_seconds: float,
                     name: str = "<waveform>") -> np.ndarray:
    """A waveform given in memory (the Python API), checked and prepared as a file's samples are:
    `samples` is [frames], [frames, channels] or [channels, frames] (librosa's and torchaudio's
    layout, told by its shape) at `rate` Hz, floats at full scale 1.0 or integers at their type's
    full scale (int16 / 32768, as a PCM file is read); `name` stands for it in messages."""
    import numpy as np

    data = _full_scale(np.asarray(samples), name)
    if data.ndim == 2 and data.shape[0] <= MAX_CHANNELS_FIRST < data.shape[1]:
        data = data.T  # [channels, frames]: the channels are downmixed as a file's are
    if data.ndim == 1:
        data = data[:, None]
    if data.ndim != 2 or rate <= 0:
        raise InputError(f"{name}: give samples as [frames], [frames, channels] or [channels, frames] with a "
                         f"positive rate, got shape {tuple(np.shape(samples))} at {rate} Hz")
    # The Python API's terms: its caller has no --segment, but has Pair.segments.
    hint = f"cut it at pauses with pair.segments(samples, rate={rate}) and describe each piece"
    return _checked(data, int(rate), sampling_rate, max_seconds, Path(name), hint)


def _full_scale(data: np.ndarray, name: str) -> np.ndarray:
    """float32 samples at full scale 1.0. Integer PCM is scaled by its type's range, as soundfile
    reads a PCM file (int16: / 32768; unsigned, e.g. 8-bit WAV's uint8: centred first): taken as
    floats, int16 speech peaks near 10,000 and the model heard clipping noise (issue 44)."""
    import numpy as np

    if data.dtype.kind == "b" or data.dtype.kind not in "iuf":
        raise InputError(f"{name}: samples of dtype {data.dtype} are not audio; give floats (full scale 1.0) "
                         "or integer PCM (int16, int32, uint8)")
    if data.dtype.kind == "f":
        return data.astype(np.float32, copy=False)
    half = 2.0 ** (8 * data.dtype.itemsize - 1)
    centred = data.astype(np.float64) - (half if data.dtype.kind == "u" else 0.0)
    return (centred / half).astype(np.float32)


# -- long recordings (--segment) ---------------------------------------------------------------------

def recording_info(path: Path, data: bytes | None = None, cap_seconds: float = MAX_RECORDING_SECONDS):
    """Open a recording for `mono_blocks`: the checks load_audio makes before decoding, with the
    recordings' cap for the length the header states (refused at once, before any decoding)."""
    info = _opened(path, data)
    _check_format(info, path)
    stated = _stated_seconds(info)
    if stated is not None and stated > cap_seconds:
        raise _over_cap(path, f"{_hours(stated)} long", cap_seconds)
    return info


def mono_blocks(path: Path, data: bytes | None, info, cap_seconds: float = MAX_RECORDING_SECONDS,
                block_frames: int = BLOCK_FRAMES) -> Iterator[np.ndarray]:
    """The recording as consecutive blocks of mono float32 samples at its own rate, read forward
    (as _decode reads a clip) and checked as they come: decoding stops, refused, past
    `cap_seconds` (+ 1 frame, whatever the header said) or at a NaN or infinite sample. Each block
    is at most `block_frames` long; only one is held at a time."""
    import numpy as np

    cap = math.floor(cap_seconds * info.samplerate)
    total = 0
    noted = False  # the channels' note, once per recording (from its first block where they differ)
    try:
        with _forward(path, data, info) as f:
            while total <= cap:
                block = f.read(min(block_frames, cap + 1 - total), dtype="float32", always_2d=True)
                if block.shape[0] == 0:
                    return
                total += block.shape[0]
                if total > cap:
                    raise _over_cap(path, f"over {_hours(cap_seconds)} long", cap_seconds)
                if not np.isfinite(block).all():
                    raise InputError(f"{path} contains NaN or infinite samples; re-export the audio")
                _refuse_over_scale(block, path, _lossy(info))
                if not noted and channels_differ(block):
                    _note_channels(block, path)
                    noted = True
                yield np.ascontiguousarray(_mono(block), dtype=np.float32)
    except InputError:
        raise
    except Exception as exc:  # a decoder's failure on a damaged file, whatever its type: one line
        raise InputError(f"cannot decode {path} as audio ({_reason(exc)}); give a {_formats_hint()} file") from exc


def waveform_mono(samples: np.ndarray, rate: int, name: str = "<waveform>",
                  cap_seconds: float = MAX_RECORDING_SECONDS) -> np.ndarray:
    """A waveform given in memory as a recording: mono float32, checked as mono_blocks checks a file."""
    import numpy as np

    data = np.asarray(samples, dtype=np.float32)
    if data.ndim == 1:
        data = data[:, None]
    if data.ndim != 2 or rate <= 0:
        raise InputError(f"{name}: give samples as [frames] or [frames, channels] with a positive rate, "
                         f"got shape {tuple(np.shape(samples))} at {rate} Hz")
    if data.shape[0] > math.floor(cap_seconds * rate):
        raise _over_cap(Path(name), f"{_hours(data.shape[0] / rate)} long", cap_seconds)
    if not np.isfinite(data).all():
        raise InputError(f"{name} contains NaN or infinite samples; re-export the audio")
    _refuse_over_scale(data, name)
    return np.ascontiguousarray(_mono(data), dtype=np.float32)


def _not_a_recording(path: Path | str, peak: float) -> InputError:
    return InputError(f"{path} holds samples up to {peak:.3g}, over {MAX_PEAK:g} times full scale (1.0): "
                      "not a recording; re-export the audio")


def _refuse_over_scale(data: np.ndarray, path: Path | str, lossy: bool = False) -> None:
    """A recording read in blocks (--segment) cannot be rescaled as a whole: samples over
    OVER_SCALE (INT16_SCALED when `lossy`) are refused with the fix (a clip is rescaled instead:
    _at_full_scale)."""
    import numpy as np

    peak = float(np.abs(data).max()) if data.size else 0.0
    if peak > MAX_PEAK:
        raise _not_a_recording(path, peak)
    if peak > (INT16_SCALED if lossy else OVER_SCALE):
        raise _over_scale(path, peak)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.1f} s"


def _over_cap(path: Path, what: str, cap_seconds: float) -> InputError:
    return InputError(f"{path} is {what}; --segment reads at most {_hours(cap_seconds)} per file: cut it into "
                      "shorter files")


# A band-limited clip: (nearly) none of its energy lies above 4 kHz, which is what a telephone line
# (300-3400 Hz) or any recording at 8 kHz leaves. The band above 4 kHz carries much of what tells
# voices apart: the demo pair v4 called 46 of 48 telephone-band women men (issue 51), so such a clip's
# record says so (`band_limited`) and the CLI says it once per run. Measured on the samples the
# models hear (16 kHz mono, after resampling): the share of the clip's energy at or above
# BAND_LIMIT_HZ, from its periodogram (numpy's FFT of the whole clip, the mean taken out, its first
# and last 50 ms faded in and out with a raised cosine), against BAND_LIMITED_DB. The fades matter:
# the FFT treats the clip as periodic, so a clip cut off mid-sound (its last sample far from its
# first) adds a step whose energy spreads over every frequency — the bundled f_telephone.wav, a
# G.711 line cut at 0.19 of full scale, measured -43 dB unfaded, wideband, and -116 dB faded; the
# fades move the wideband samples' figures by less than 0.1 dB. Measured here: the bundled samples and espeak-ng speech put -17 to -33 dB of their
# energy there (11.025 kHz copies of them: -28 to -37 dB; 32 kb/s MP3: as the source), their
# telephone-band copies (`sox in.wav -r 8000 out.wav sinc 300-3400`, G.711 mu-law, or the same
# filter kept at 16 kHz) -59 dB or less; -45 dB lies between, some 10 dB from either side.
BAND_LIMIT_HZ = 4000.0
BAND_LIMITED_DB = -45.0
BAND_FADE_S = 0.05


def band_limited(samples: np.ndarray, rate: int) -> bool:
    """Whether a clip (mono samples at `rate` Hz) has (nearly) no energy above 4 kHz: at most
    BAND_LIMITED_DB of it at or above BAND_LIMIT_HZ (see above). A rate of 8 kHz or less cannot hold
    any; a clip with no energy at all (silence, refused before it gets here) is not band-limited."""
    import numpy as np

    if rate <= 2 * BAND_LIMIT_HZ:
        return True
    x = np.asarray(samples, dtype=np.float64)
    x = x - x.mean()
    n = min(int(BAND_FADE_S * rate), len(x) // 2)
    if n > 1:  # the raised-cosine fades (see above); numpy's Hann window, halved
        ramp = np.hanning(2 * n)[:n]
        x[:n] *= ramp
        x[-n:] *= ramp[::-1]
    power = np.abs(np.fft.rfft(x)) ** 2
    total = float(power.sum())
    if not total > 0:
        return False
    above = float(power[np.fft.rfftfreq(len(x), 1.0 / rate) >= BAND_LIMIT_HZ].sum())
    return above <= total * 10 ** (BAND_LIMITED_DB / 10)
