"""A presets file's keys are checked (issue 25): a misspelled key, which used to be ignored silently
(the preset then decoded with another setting than the one written), is refused in one line that
names the nearest valid key (difflib's), exit 2, before any model is loaded; a setting outside any
preset's table likewise. Every file specdec ships or writes passes the same check."""

from __future__ import annotations

import pytest
from cli_helpers import run_specdec

from specdec_cli.errors import InputError
from specdec_cli.presets import ALLOWED_KEYS, check_presets_file, configs_dir, load_presets


@pytest.mark.parametrize(("text", "message"), [
    ("[quality]\ntreshold = 0.5\n", "unknown key 'treshold' in [quality]; did you mean 'threshold'?"),
    ("[fluent]\nk = 4\ntop-p = 0.9\n", "unknown key 'top-p' in [fluent]; did you mean 'top_p'?"),
    ("[fluent]\ntemprature = 0.7\n", "unknown key 'temprature' in [fluent]; did you mean 'temperature'?"),
    ("[mine]\nbananas = 3\n", "unknown key 'bananas' in [mine]; a preset takes " + ", ".join(ALLOWED_KEYS)),
    ("threshold = 0.5\n", "'threshold' is outside any preset; put it under the table of the preset it sets, "
                          "e.g. [quality]"),
])
def test_a_key_no_preset_takes_is_refused_naming_the_nearest(tmp_path, text, message):
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as bad:
        check_presets_file(path)
    assert bad.value.message == f"presets file {path}: {message}" and bad.value.exit_code == 2
    with pytest.raises(InputError):  # the model folder's file is read the same way
        load_presets([path])


def test_every_shipped_presets_file_passes():
    """configs/*.toml, the demo edge's calibrated file: nothing of theirs is refused."""
    from specdec_cli.models import DEMO_DIR, PRESETS_FILE

    assert set(load_presets([DEMO_DIR / "edge" / PRESETS_FILE])) >= {"fluent", "quality"}
    assert sorted(p.name for p in configs_dir().glob("*.toml")) == ["fluent.toml", "quality.toml"]


@pytest.mark.spawns
def test_the_cli_refuses_a_misspelled_key_in_one_line(tmp_path):
    """Before: exit 0, the file's `treshold = 0.0` ignored, the sentence decoded at the preset's own
    threshold."""
    path = tmp_path / "p.toml"
    path.write_text('[quality]\ndescription = "mine"\ntreshold = 0.0\n', encoding="utf-8")
    wav = next(configs_dir().parent.glob("samples/*.wav"))
    done = run_specdec("describe", str(wav), "--presets", str(path), "--preset", "quality", "--max-new-tokens", "4")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: presets file {path}: unknown key 'treshold' in [quality]; did you mean 'threshold'?\n"
