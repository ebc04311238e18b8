"""The settings that made a result record. Every record carries them (`settings`), so a batch
resumes a clip only when it was described the way this run would describe it.

Only what can change the sentence is kept, and only where it can: the speculative knobs (preset,
threshold, k, verify, uncertainty) are blanked for edge-only and cloud-only runs, and seed,
temperature, top_p and top_k for greedy ones; instruction and system are blank for the default
prompt. The specdec version stands for everything the flags do not show
(the decoding rules, the constraint knobs); records from specdec 0.1 carry no settings at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import __version__
from .decoding.config import DecodingConfig
from .metrics import json_safe
from .models import dtype_name


@dataclass(frozen=True)
class RunSettings:
    mode: str
    preset: str | None
    threshold: float | None
    k: int | None
    verify: str | None
    uncertainty: str | None
    constraints: bool
    max_new_tokens: int
    sample: bool
    seed: int | None
    temperature: float | None
    edge: str
    cloud: str
    dtype: str
    version: str
    # A remote cloud (--cloud URL) is known by the model its server reports and a fingerprint of
    # its weights, so resuming compares models, not addresses; None for an in-process cloud.
    cloud_weights: str | None = None
    top_p: float | None = None
    top_k: int | None = None
    instruction: str | None = None
    system: str | None = None

    @classmethod
    def of(cls, cfg: DecodingConfig, preset: str | None, edge: str, cloud: str, dtype: str,
           cloud_weights: str | None = None) -> RunSettings:
        """`edge` and `cloud` as load_pair gets them (a folder or a Hub id; for a remote cloud the
        model its server reports, with `cloud_weights`)."""
        spec = cfg.mode == "spec"
        return cls(
            mode=cfg.mode,
            preset=preset if spec else None,
            threshold=float(cfg.threshold) if spec else None,
            k=cfg.k if spec else None,
            verify=cfg.verify if spec else None,
            uncertainty=cfg.uncertainty if spec else None,
            constraints=cfg.constraints,
            max_new_tokens=cfg.max_new_tokens,
            sample=cfg.sample,
            seed=cfg.seed if cfg.sample else None,
            temperature=float(cfg.temperature) if cfg.sample else None,
            edge=model_id(edge),
            cloud=model_id(cloud),
            dtype=dtype_name(dtype),  # fp32 and float32 load the same weights
            version=__version__,
            cloud_weights=cloud_weights,
            top_p=float(cfg.top_p) if cfg.sample else None,
            top_k=cfg.top_k if cfg.sample else None,
            instruction=cfg.instruction,
            system=cfg.system,
        )

    def as_record(self) -> dict[str, Any]:
        """The `settings` field of a record (strict JSON: an infinite threshold is "inf")."""
        return json_safe(asdict(self))


def model_id(given: str) -> str:
    """A model folder by its absolute path (the same folder named from another directory is the
    same model); a Hub id as given."""
    path = Path(given)
    return str(path.resolve()) if "://" not in given and path.is_dir() else given


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """'mode cloud → spec, preset - → quality': each setting that differs, recorded → this run."""
    def shown(value: Any) -> str:
        return "-" if value is None else str(value)

    keys = list(current) + [k for k in recorded if k not in current]
    # A setting one side lacks differs even when the other side's value is null (a field a newer
    # version added): listed, so the refusal never names no difference.
    return ", ".join(f"{k} {shown(recorded.get(k))} → {shown(current.get(k))}"
                     for k in keys if recorded.get(k) != current.get(k) or (k in recorded) != (k in current))
