"""Presets: configs/*.toml, overridden by a model folder's own `specdec_presets.toml` (the demo
pair ships thresholds calibrated for its vocabulary), overridden by explicit flags."""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

PRESET_KEYS = ("threshold", "k", "uncertainty", "verify")


def configs_dir() -> Path:
    """configs/ beside the package (source checkout / editable install), else the copy a wheel
    installs under <prefix>/share/specdec/configs."""
    for candidate in (Path(__file__).resolve().parents[1] / "configs", Path(sys.prefix) / "share" / "specdec" / "configs"):
        if candidate.is_dir():
            return candidate
    raise InputError("cannot find the presets folder configs/; reinstall specdec")


@dataclass(frozen=True)
class Preset:
    name: str
    values: dict            # subset of PRESET_KEYS
    source: str             # where the values came from
    description: str = ""


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read presets file {path}: {exc}") from exc


def _shown(path: Path) -> str:
    """A path as a user would type it: relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_presets(model_presets: Path | None = None) -> dict[str, Preset]:
    """All presets by name. A model folder's file replaces the values it names."""
    presets: dict[str, Preset] = {}
    for path in sorted(configs_dir().glob("*.toml")):
        data = _read(path)
        presets[path.stem] = Preset(path.stem, {k: data[k] for k in PRESET_KEYS if k in data},
                                    f"configs/{path.name}", data.get("description", ""))
    if model_presets is not None:
        for name, table in _read(model_presets).items():
            if not isinstance(table, dict):
                continue
            base = presets.get(name, Preset(name, {}, "", ""))
            values = {**base.values, **{k: table[k] for k in PRESET_KEYS if k in table}}
            presets[name] = Preset(name, values, _shown(model_presets), table.get("description", base.description))
    return presets


def resolve(name: str, model_presets: Path | None = None) -> Preset:
    presets = load_presets(model_presets)
    if name not in presets:
        raise InputError(f"unknown preset {name!r}; choose one of: {', '.join(sorted(presets))}")
    return presets[name]
