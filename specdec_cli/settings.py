"""Settings, resolved once per run: built-in defaults < presets files (configs/, the edge folder's,
--presets) < the preset < explicit settings. All without loading a model, so a bad setting, an
unknown preset or a results file made otherwise is refused before the load is paid for; a remote
cloud's /health is read here, once per run, and handed to the loader.

`PairSpec`: which pair a run uses, where, and which presets files it reads. `Settings`: what one
run decodes with (`cfg`), the preset name its records show and `RunSettings`, the settings every
record carries (`settings`), so a batch resumes a clip only when it was described the way this run
would describe it.

Only what can change the sentence is kept in RunSettings, and only where it can: the speculative
knobs (preset, threshold, k, verify, uncertainty) are blanked for edge-only and cloud-only runs,
and seed, temperature, top_p and top_k for greedy ones; instruction and system are blank for the
default prompt. The specdec version stands for everything the flags do not show (the decoding
rules, the constraint knobs); records from specdec 0.1 carry no settings at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from . import __version__
from .checkpoints import check_model, dtype_name, model_id
from .decoding.config import DecodingConfig
from .errors import InputError
from .models import is_url, presets_file_for, remote_client, with_demo
from .presets import Preset, check_presets_file, resolve
from .strict_json import json_safe


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
    # --segment: long recordings cut into segments, each its own record. Left out of a record's
    # settings when off, so the records of whole clips read as they did before it existed.
    segment: bool = False
    # verify = "meaning": the gate's two thresholds and which gate (gate_presets.gate_id of the
    # presets files' [gate] table; None: none, so the entropy gate). Left out of a record's
    # settings for every other verify, so records read as they did before the gate existed.
    gate_upload: float | None = None
    gate_verify: float | None = None
    gate: str | None = None

    @classmethod
    def of(cls, cfg: DecodingConfig, preset: str | None, edge: str, cloud: str, dtype: str,
           cloud_weights: str | None = None, gate: str | None = None) -> RunSettings:
        """`edge` and `cloud` as load_pair gets them (a folder or a Hub id; for a remote cloud the
        model its server reports, with `cloud_weights`); `gate`: the presets files' gate id."""
        spec = cfg.mode == "spec"
        meaning = spec and cfg.verify == "meaning"
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
            gate_upload=float(cfg.gate_upload) if meaning else None,
            gate_verify=float(cfg.gate_verify) if meaning else None,
            gate=gate if meaning else None,
        )

    @property
    def meaning(self) -> bool:
        return self.verify == "meaning"

    def as_record(self) -> dict[str, Any]:
        """The `settings` field of a record (strict JSON: an infinite threshold is "inf")."""
        record = json_safe(asdict(self))
        if not self.segment:
            del record["segment"]
        if not self.meaning:
            for key in ("gate_upload", "gate_verify", "gate"):
                del record[key]
        return record


# How each setting reads in a sentence; None is a setting that does not apply (or the default).
_WORDS: dict[str, tuple[str, str]] = {   # key -> (with a value: "{}" is the value, without one)
    "mode": ("mode {}", "no mode"),
    "preset": ("preset {}", "no preset"),
    "threshold": ("threshold {}", "no threshold"),
    "k": ("blocks of k {} tokens", "no draft blocks"),
    "verify": ("verify {}", "no verification"),
    "uncertainty": ("uncertainty {}", "no uncertainty gate"),
    "constraints": ("constraints {}", "no constraints setting"),
    "max_new_tokens": ("at most {} tokens", "no token limit recorded"),
    "sample": ("sampling {}", "no sampling setting"),
    "seed": ("seed {}", "no seed (greedy)"),
    "temperature": ("temperature {}", "no temperature (greedy)"),
    "top_p": ("top-p {}", "no top-p (greedy)"),
    "top_k": ("top-k {}", "no top-k (greedy)"),
    "edge": ("edge {}", "no edge recorded"),
    "cloud": ("cloud {}", "no cloud recorded"),
    "dtype": ("dtype {}", "no dtype recorded"),
    "version": ("specdec {}", "no specdec version recorded"),
    "cloud_weights": ("a remote cloud whose weights are {}", "an in-process cloud"),
    "instruction": ("the instruction {!r}", "the default instruction"),
    "system": ("the system prompt {!r}", "the default system prompt"),
    "segment": ("recordings cut into segments (--segment)", "whole clips (no --segment)"),
    "gate_upload": ("the meaning gate's upload threshold {}", "no meaning gate upload threshold"),
    "gate_verify": ("the meaning gate's verify threshold {}", "no meaning gate verify threshold"),
    "gate": ("the meaning gate {}", "no meaning gate (the entropy gate)"),
}


def in_words(key: str, value: Any) -> str:
    """One setting as a reader says it: 'preset quality', 'an in-process cloud', 'no seed (greedy)'."""
    if key == "segment":  # off is left out of a record's settings: absent and false read alike
        value = value or None
    if isinstance(value, bool):
        value = "on" if value else "off"
    with_value, without = _WORDS.get(key, (f"{key} {{}}", f"no {key}"))
    return without if value is None else with_value.format(value)


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """What made a record and what this run has, in words, for the settings that differ:
    'made with mode cloud, no preset (one model alone); this run has mode spec, preset quality'."""
    keys = list(current) + [k for k in recorded if k not in current]
    # A setting one side lacks differs even when the other side's value is null (a field a newer
    # version added): listed, so the refusal never names no difference.
    differ = [k for k in keys if recorded.get(k) != current.get(k) or (k in recorded) != (k in current)]
    made = ", ".join(in_words(k, recorded.get(k)) for k in differ)
    has = ", ".join(in_words(k, current.get(k)) for k in differ)
    return f"made with {made}; this run has {has}"


# -- explicit settings ------------------------------------------------------------------------------

def explicit(**given: Any) -> dict[str, Any]:
    """The settings actually given (None: not given), enums as their values, checked now (a preset
    cannot make a bad setting good): InputError before any model loads."""
    overrides = {}
    for name, value in given.items():
        if value is None:
            continue
        overrides[name] = value.value if isinstance(value, Enum) else value
    decoding_config(Preset("defaults", {}, "built-in"), overrides)
    return overrides


def decoding_config(preset: Preset, overrides: dict[str, Any]) -> DecodingConfig:
    """Built-in defaults < preset < explicit settings."""
    try:
        cfg = DecodingConfig().with_(**preset.values)
    except (TypeError, ValueError) as exc:
        raise InputError(f"preset {preset.name!r} from {preset.source} is invalid: {exc}") from exc
    try:
        return cfg.with_(**overrides)
    except (TypeError, ValueError) as exc:
        raise InputError(f"bad decoding option: {exc}") from exc


def check_wire_settings(cfg: DecodingConfig) -> None:
    """`cfg` by the schema a `specdec serve` checks it with (remote/wire.py's DecodingSettings, the
    same ranges): a preset the server would refuse is an InputError before any model loads, not a
    failure of every clip after they have (issue 33)."""
    import msgspec

    from .remote import wire

    try:
        msgspec.convert(cfg.as_dict(), wire.DecodingSettings)
    except msgspec.ValidationError as exc:
        raise InputError(f"a `specdec serve` cloud refuses these decoding settings ({wire.first_line(exc)}); "
                         "change the preset or the flag that sets it") from None


# -- one run ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """What a run decodes with, and what its records say about it."""

    cfg: DecodingConfig
    preset: str | None      # the preset name records show (None outside the speculative mode)
    run: RunSettings        # every record's `settings`
    rtt_ms: float | None = None  # a modelled round trip: adds latency_modelled_s to records

    def segmented(self) -> Settings:
        """These settings for a run that cuts recordings into segments (--segment)."""
        from dataclasses import replace

        return self if self.run.segment else replace(self, run=replace(self.run, segment=True))


@dataclass(frozen=True)
class PairSpec:
    """Which pair a run uses and where, found without loading a model: model folders and Hub ids
    as given (the bundled demo pair for any not given), devices, dtype, the presets files read
    (the edge folder's, then --presets) and, for a remote cloud, its /health as read once. Plain
    data: it pickles, so Ray workers load and decode exactly what the driver resolved."""

    edge: str | None           # None: the bundled demo model (each process its own copy)
    cloud: str | None
    device: str = "cpu"
    dtype: str = "float32"
    edge_device: str | None = None
    cloud_device: str | None = None
    presets_files: tuple[Path, ...] = ()
    cloud_info: dict[str, Any] | None = field(default=None, compare=False)
    cloud_timeout: float | None = None  # each request's total deadline (None: $SPECDEC_CLOUD_TIMEOUT, else 60 s)
    # The presets files' meaning gate (their last [gate] table), read once here so that Ray workers
    # decode with the driver's gate without re-reading a file their node may lack. Whether it fits
    # the tokenizer is checked when the pair loads (pair.Pair). A gate.MeaningGate, or None.
    gate: Any = field(default=None, compare=False)
    upload: str = "lazy"  # when a clip goes up to a remote cloud (remote/client.py UPLOADS)
    # What a clip does when its remote cloud fails it, and the cloud's budget for a whole clip
    # (describe.CloudPolicy; "fail" and None: a failure is the clip's error, as before).
    on_cloud_failure: str = "fail"
    cloud_deadline: float | None = None
    # A --cloud URL that could not be reached at the start, with on_cloud_failure "edge" (or a run
    # that needs no cloud: --mode edge): its one-line error. The run then describes on the edge
    # alone and marks every record (describe.Describer), instead of refusing to start (issue 44).
    cloud_down: str | None = field(default=None, compare=False)
    # Verifications a clip keeps in flight with a remote cloud: 1..4, or "auto" (RemoteClient.depth;
    # the rule: decoding/block_length.py's best_depth). It changes no token.
    depth: int | str = field(default=1, compare=False)

    @classmethod
    def of(cls, edge: str | None = None, cloud: str | None = None, device: str = "cpu", dtype: str = "float32",
           presets: str | Path | None = None, *, edge_device: str | None = None,
           cloud_device: str | None = None, cloud_timeout: float | None = None, upload: str | None = None,
           on_cloud_failure: str = "fail", cloud_deadline: float | None = None,
           cloud_needed: bool = True, depth: int | str | None = None) -> PairSpec:
        """Check what can be checked without loading (the dtype, the presets file, the model
        folders) and ask a remote cloud who it is. A cloud that is down: with `on_cloud_failure`
        "edge", or when the run needs no cloud (`cloud_needed` False: --mode edge), the spec says so
        (`cloud_down`) and the run describes on the edge; else CloudUnreachable (exit 2), whose line
        names `--mode edge`. `upload` and `depth` go with a remote cloud only (None: not given; then
        lazy, and depth REMOTE_DEPTH with a remote cloud): given without one, they are refused."""
        dtype_name(dtype)
        if cloud_timeout is not None:
            from .remote.exchange import cloud_timeout as checked_timeout

            checked_timeout(cloud_timeout)  # nan, inf, 0: exit 2 before loading
        if upload is not None and upload not in ("eager", "lazy", "auto"):
            raise InputError(f"--upload {upload} is not a choice; give --upload eager, lazy or auto")
        from .decoding.block_length import REMOTE_DEPTH, parse_depth

        given_depth = parse_depth(depth) if depth is not None else None  # 1..4 or auto, else one line, exit 2
        if not is_url(with_demo(edge, cloud)[1]):
            # Options that cannot apply are refused, not ignored (issue 52): with the cloud in this
            # process nothing goes up and a verdict comes back at once.
            for flag, value, why in (("--upload", upload, "no clip goes up"),
                                     ("--depth", depth, "a verdict comes back at once, with nothing to overlap")):
                if value is not None:
                    raise InputError(f"{flag} goes with --cloud http://…; with the cloud in this process {why}: "
                                     f"leave {flag} out")
        upload = upload or "lazy"
        depth = given_depth if given_depth is not None else REMOTE_DEPTH
        from .describe import CloudPolicy

        CloudPolicy(on_cloud_failure, cloud_deadline)  # a bad choice or deadline: exit 2 before loading
        presets_file = check_presets_file(Path(presets) if presets is not None else None)
        files = tuple(f for f in (presets_file_for(edge), presets_file) if f is not None)
        from .gate_presets import load_gates  # numpy: not on `specdec --help`'s path

        gate = load_gates(files)  # a malformed [gate] table: one line now, before any model loads
        edge_ref, cloud_ref = with_demo(edge, cloud)
        check_model(edge_ref, "edge")
        info = None
        down = None
        if is_url(cloud_ref):
            from .errors import one_line
            from .remote.client import CloudUnreachable

            try:
                client = remote_client(cloud_ref, timeout_s=cloud_timeout)
            except CloudUnreachable as exc:
                if on_cloud_failure != "edge" and cloud_needed:
                    raise CloudUnreachable(f"{one_line(exc)}; or describe on the edge alone: --mode edge") from None
                down = one_line(exc)
            else:
                client.close()
                info = client.info
        else:
            check_model(cloud_ref, "cloud")
        return cls(edge, cloud, device, dtype, edge_device, cloud_device, files, info, cloud_timeout, gate, upload,
                   on_cloud_failure, cloud_deadline, down, depth)

    @property
    def remote(self) -> bool:
        return self.cloud_info is not None

    def cloud_policy(self) -> Any:
        """What a clip does when its remote cloud fails it (a describe.CloudPolicy)."""
        from .describe import CloudPolicy

        return CloudPolicy(self.on_cloud_failure, self.cloud_deadline)

    def portable(self) -> PairSpec:
        """The same spec for another process: model folders by absolute path (a worker's current
        directory need not be ours); Hub ids and a cloud URL as given; the bundled demo pair stays
        None (each worker's own copy)."""
        from dataclasses import replace

        def absolute(ref: str | None) -> str | None:
            return model_id(ref) if ref is not None and not is_url(ref) else ref

        return replace(self, edge=absolute(self.edge), cloud=absolute(self.cloud))

    def settings(self, preset: str = "fluent", overrides: dict[str, Any] | None = None,
                 rtt_ms: float | None = None) -> Settings:
        """This pair's settings under `preset` and `overrides` (see `explicit`)."""
        chosen = resolve(preset, list(self.presets_files))
        cfg = decoding_config(chosen, overrides or {})
        name = chosen.name if cfg.mode == "spec" else None
        edge, cloud = with_demo(self.edge, self.cloud)
        gate = None
        if cfg.mode == "spec" and self.gate is not None:
            from .decoding.gate import active
            from .gate_presets import gate_id

            # The gate the loop will decode with (decoding.gate.active): none for another
            # instruction or system turn, so the record does not name a gate that did not decide.
            fitted = active(cfg, self.gate)
            gate = gate_id(fitted) if fitted is not None else None
        if self.cloud_info is not None:
            check_wire_settings(cfg)  # what the server would refuse: one line now, before a model loads
            info = self.cloud_info  # as RemoteClient.model_id and .fingerprint read it
            run = RunSettings.of(cfg, name, edge, str(info.get("model", cloud.rstrip("/"))), self.dtype,
                                 str(info.get("fingerprint", "")), gate)
        else:
            run = RunSettings.of(cfg, name, edge, cloud, self.dtype, gate=gate)
        return Settings(cfg, name, run, rtt_ms)
