"""Audio files that encoders do not write on purpose, made from ones they do, byte by byte:

* a FLAC whose STREAMINFO gives another total sample count (0 = "unknown": what a FLAC encoder
  writing to a pipe leaves, since it cannot seek back to fill it in);
* a VBR MP3 without its Xing/Info frame (what older encoders and some streams give): libmpg123
  then estimates the length from the first frame's bitrate.

Formats: FLAC's STREAMINFO (RFC 9639 §8.2: the 36-bit total sample count at bits 108-143 of the
block, which starts at byte 8); MPEG-1/2/2.5 Layer III frame headers (ISO/IEC 11172-3 §2.4.2.3,
13818-3: the frame length from the bitrate, sample rate and padding bit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf


def flac_with_total(data: bytes, total: int) -> bytes:
    """`data` (a FLAC file, STREAMINFO first, as libsndfile writes it) claiming `total` samples."""
    b = bytearray(data)
    assert b[:4] == b"fLaC" and b[4] & 0x7F == 0, "STREAMINFO must be the first metadata block"
    b[21] = (b[21] & 0xF0) | ((total >> 32) & 0x0F)
    b[22:26] = (total & 0xFFFFFFFF).to_bytes(4, "big")
    b[26:42] = bytes(16)  # MD5 of the samples: all zero means "not computed"
    return bytes(b)


_L3_KBPS = {1: [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320],      # MPEG-1
            2: [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160]}          # MPEG-2 and 2.5
_RATES = {3: [44100, 48000, 32000], 2: [22050, 24000, 16000], 0: [11025, 12000, 8000]}  # by version bits


def mp3_frame_length(header: bytes) -> int:
    """Bytes in the Layer III frame that starts with this 4-byte header."""
    assert header[0] == 0xFF and header[1] & 0xE0 == 0xE0 and (header[1] >> 1) & 3 == 1, "not a Layer III frame"
    version = (header[1] >> 3) & 3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
    kbps = _L3_KBPS[1 if version == 3 else 2][header[2] >> 4]
    rate = _RATES[version][(header[2] >> 2) & 3]
    return (144 if version == 3 else 72) * kbps * 1000 // rate + ((header[2] >> 1) & 1)


def vbr_mp3_without_xing(path: Path, seconds_loud: float, seconds_quiet: float, sr: int = 16000) -> Path:
    """A VBR MP3 (libsndfile's LAME encoder) that opens with noise, so its first frames have a high
    bitrate, then a quiet tone; its Xing frame, which holds the true frame count, removed. The
    length estimated from the first frame is then far shorter than the clip."""
    rng = np.random.default_rng(0)
    loud = 0.5 * rng.standard_normal(int(sr * seconds_loud))
    t = np.arange(int(sr * seconds_quiet)) / sr
    quiet = 0.05 * np.sin(2 * np.pi * 200 * t)
    sf.write(str(path), np.concatenate([loud, quiet]).astype(np.float32), sr, format="MP3",
             bitrate_mode="VARIABLE", compression_level=0.0)
    data = path.read_bytes()
    first = mp3_frame_length(data[:4])
    assert b"Xing" in data[:first] or b"Info" in data[:first], "libsndfile wrote no Xing frame to remove"
    path.write_bytes(data[first:])
    return path


def write_m4a(path: Path, samples: np.ndarray, sr: int = 16000) -> Path:
    """`samples` (mono float32) as an AAC track in an MP4 container (.m4a, what phones record),
    encoded by PyAV's bundled ffmpeg; the test skips where PyAV is missing."""
    av = pytest.importorskip("av")
    x = np.ascontiguousarray(samples, dtype=np.float32)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=sr)
        stream.layout = "mono"
        for i in range(0, len(x), 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[None, i:i + 1024]), format="flt", layout="mono")
            frame.rate = sr
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path
