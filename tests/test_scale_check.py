"""Float samples beyond full scale (issue 52, point 2): a float WAV (or a float32 array through the
API) written at 16-bit integers' scale, ±32767, is read as 16-bit PCM would be, with one note; far
over full scale at no readable scale is refused with the fix; --segment refuses it with the fix;
a little over (a lossy decoder's overshoot) is heard as it is.

The oracle: the same speech written at full scale; the int16-scaled copy must read back as it,
within float32 rounding, and describe as it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import FAST, SR
from typer.testing import CliRunner

from specdec_cli.audio import RescaledClip, load_audio
from specdec_cli.commands.app import app
from specdec_cli.errors import InputError

pytest_plugins = ["cli_fixtures"]

SAMPLE = "samples/m_mid_high.wav"
MAX_S = 30.0


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    from pathlib import Path

    return sf.read(str(Path(__file__).resolve().parents[1] / SAMPLE), dtype="float32")[0]


def test_a_float_wav_at_16_bit_scale_is_read_as_16_bit_with_one_note(tmp_path, speech):
    scaled = tmp_path / "int16_scale.wav"
    sf.write(str(scaled), speech * 32767, SR, subtype="FLOAT")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = load_audio(scaled, SR, MAX_S)
    notes = [w for w in caught if issubclass(w.category, RescaledClip)]
    assert len(notes) == 1 and "16-bit's scale" in str(notes[0].message) and "\n" not in str(notes[0].message)
    np.testing.assert_allclose(samples, speech * 32767 / 32768, atol=1e-6)


@pytest.mark.parametrize("peak", [7.5, 40.0, 1e4 * 5])
def test_far_over_full_scale_at_no_readable_scale_is_refused_with_the_fix(tmp_path, speech, peak):
    path = tmp_path / "over.wav"
    sf.write(str(path), speech / np.abs(speech).max() * peak, SR, subtype="FLOAT")
    with pytest.raises(InputError, match=r"far over full scale \(1\.0\).*re-export it as 16-bit PCM or as float at "
                                         r"full scale 1\.0"):
        load_audio(path, SR, MAX_S)


def test_a_little_over_full_scale_is_heard_as_it_is(tmp_path, speech):
    path = tmp_path / "hot.wav"
    hot = speech / np.abs(speech).max() * 1.5
    sf.write(str(path), hot, SR, subtype="FLOAT")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RescaledClip)
        np.testing.assert_array_equal(load_audio(path, SR, MAX_S), hot.astype(np.float32))


def test_a_lossy_decoders_overshoot_is_heard_as_it_is_where_a_float_wav_is_refused(tmp_path, speech):
    """An MP3 decodes to what its spectrum says, up to 3.0 here: a codec's overshoot, never a
    16-bit-scale export (the CI's VBR MP3 of noise decoded to 2.04 and was refused). The control:
    the same samples as a float WAV are refused."""
    hot = speech / np.abs(speech).max() * 3.0
    mp3, wav = tmp_path / "hot.mp3", tmp_path / "hot.wav"
    sf.write(str(mp3), hot, SR, format="MP3")
    sf.write(str(wav), hot, SR, subtype="FLOAT")
    decoded = sf.read(str(mp3), dtype="float32")[0]
    assert np.abs(decoded).max() > 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RescaledClip)
        np.testing.assert_array_equal(load_audio(mp3, SR, MAX_S), decoded)
    with pytest.raises(InputError, match="far over full scale"):
        load_audio(wav, SR, MAX_S)


def test_the_api_reads_a_float32_array_at_16_bit_scale_as_the_cli_does(tiny_pair, speech):
    from specdec import Pair

    pair = Pair(*tiny_pair)
    with pytest.warns(RescaledClip, match="16-bit's scale"):
        name, samples = pair.read(speech * 32767, rate=SR)
    np.testing.assert_allclose(samples, speech * 32767 / 32768, atol=1e-6)
    assert (pair.describe(speech * 32767, rate=SR, max_new_tokens=8).description
            == pair.describe(speech * 32767 / 32768, rate=SR, max_new_tokens=8).description)


def test_describe_says_it_once_and_describes_it_as_the_full_scale_file(tmp_path, speech, models):
    scaled, plain = tmp_path / "int16_scale.wav", tmp_path / "plain.wav"
    sf.write(str(scaled), speech * 32767, SR, subtype="FLOAT")
    sf.write(str(plain), speech * 32767 / 32768, SR, subtype="FLOAT")
    runner = CliRunner()
    got = runner.invoke(app, ["describe", str(scaled), *models, *FAST, "--quiet"])
    want = runner.invoke(app, ["describe", str(plain), *models, *FAST, "--quiet"])
    assert got.exit_code == 0 and want.exit_code == 0, (got.output, want.output)
    assert got.output.count("16-bit's scale") == 1
    assert got.output.strip().splitlines()[-1] == want.output.strip().splitlines()[-1]


def test_segment_refuses_a_recording_at_16_bit_scale_with_the_fix(tmp_path, speech):
    from specdec_cli.segments import open_recording

    path = tmp_path / "long.wav"
    sf.write(str(path), np.tile(speech, 20) * 32767, SR, subtype="FLOAT")
    with pytest.raises(InputError, match=r"long.wav holds samples up to [\d.]+e\+04, far over full scale"):
        open_recording(path, SR, MAX_S)
