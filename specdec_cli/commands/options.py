"""Options shared by commands, declared once, in groups; `with_options` adds a group's options to a
command and hands the command one object for them.

Every command that loads models takes the same model, device, dtype, prompt and sampling options
with the same help (`MODELS`, `GENERATION`); describe and batch share the decoding options too
(`DECODING`). Typer reads a command's parameters from its signature, so `with_options` writes the
group's parameters into the signature it shows Typer (`__signature__`) and packs the values the
user gave into the group's object before calling the command. (Typer has no option groups of its
own; click's are decorators that Typer does not read.)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer


class Mode(StrEnum):
    spec = "spec"
    edge = "edge"
    cloud = "cloud"


class Verify(StrEnum):
    entropy = "entropy"
    always = "always"
    meaning = "meaning"


class Uncertainty(StrEnum):
    sum = "sum"
    max = "max"
    mean = "mean"


class OnOff(StrEnum):
    on = "on"
    off = "off"


# The help's panels (issue 52): what goes in, how it is decoded, the remote cloud, what comes out,
# and which models on which devices. Prompt and sampling options are decoding options.
_I, _D, _C, _O, _M = "Input", "Decoding", "Cloud", "Output", "Models"
_P = _S = _D
INPUT, OUTPUT, DECODING_PANEL = _I, _O, _D


def _opt(*decls: str, help: str, panel: str | None = None, **kw: Any) -> Any:
    """An option; those without a default worth showing (None: not given) hide it."""
    kw.setdefault("show_default", False)
    return typer.Option(*decls, help=help, rich_help_panel=panel, **kw)


# -- models: which pair, on which device ------------------------------------------------------------

@dataclass(frozen=True)
class Models:
    edge: str | None = None
    cloud: str | None = None
    device: str = "cpu"
    edge_device: str | None = None
    cloud_device: str | None = None
    dtype: str = "float32"
    cloud_timeout: float | None = None  # --cloud-timeout (None: $SPECDEC_CLOUD_TIMEOUT, else 60 s)
    upload: str | None = None  # --upload: when a clip goes up to a --cloud URL (None: not given, lazy)
    depth: str | None = None  # --depth: verifications a clip keeps in flight, 1..4 or auto (None: not given)


MODELS_PARAMS = {
    "edge": (Annotated[str | None, _opt(help="Edge model: folder or Hub id (default: bundled demo edge).",
                                        panel=_M)], None),
    "cloud": (Annotated[str | None, _opt(help="Cloud model: folder or Hub id, or http://HOST:PORT of a "
                                         "`specdec serve` (default: bundled demo cloud).", panel=_C)], None),
    "device": (Annotated[str, _opt(help="Torch device for both models.", panel=_M, show_default=True)], "cpu"),
    "edge_device": (Annotated[str | None, _opt(help="Torch device for the edge model (default: --device).",
                                               panel=_M)], None),
    "cloud_device": (Annotated[str | None, _opt(help="Torch device for the cloud model (default: --device).",
                                                panel=_M)], None),
    "dtype": (Annotated[str, _opt(help="float32, bfloat16, float16 or auto.", panel=_M, show_default=True)],
              "float32"),
    "cloud_timeout": (Annotated[float | None, _opt(
        "--cloud-timeout", metavar="SECONDS", help="The most one request may take, connect to last byte (default: "
        "$SPECDEC_CLOUD_TIMEOUT, else 60).", panel=_C)], None),
    "upload": (Annotated[str | None, _opt(
        "--upload", metavar="eager|lazy|auto", help="When a clip goes up: lazy (default) at its first escalation, "
        "eager at its start, auto as this run's clips show it pays (docs/pipelining.md).", panel=_C)], None),
    "depth": (Annotated[str | None, _opt(
        "--depth", metavar="1-4|auto", help="Verifications a clip keeps in flight (default 1; changes no token); "
        "auto: per clip, from the link (docs/pipelining.md).", panel=_C)], None),
}

# -- generation: length, prompt and sampling, for every command that decodes --------------------------

GENERATION_PARAMS = {
    "max_new_tokens": (Annotated[int | None, _opt(min=1, help="Most tokens per description (default 64).",
                                                  panel=_D)], None),
    "instruction": (Annotated[str | None, _opt(
        help="The instruction given with the audio, replacing the default (the sentence's rules stay on unless "
        "--constraints off).", panel=_P)], None),
    "system": (Annotated[str | None, _opt(help="The system prompt, replacing the default 'You are a helpful "
                                          "assistant.'.", panel=_P)], None),
    "sample": (Annotated[bool | None, _opt("--sample/--greedy", help="Sample (lossless rejection sampling) or "
                                           "decode greedily (default).", panel=_S)], None),
    "seed": (Annotated[int | None, _opt(help="Random seed for --sample.", panel=_S)], None),
    "temperature": (Annotated[float | None, _opt(help="With --sample: divide the logits by this (default 1).",
                                                 panel=_S)], None),
    "top_p": (Annotated[float | None, _opt("--top-p", help="With --sample: nucleus mass (default 1: all).",
                                           panel=_S)], None),
    "top_k": (Annotated[int | None, _opt("--top-k", help="With --sample: the k likeliest tokens (default 0: all).",
                                         panel=_S)], None),
}

# -- the meaning gate's thresholds (describe, batch, eval) ---------------------------------------------

GATE_PARAMS = {
    "gate_upload": (Annotated[float | None, _opt(
        "--gate-upload", help="Verify meaning: the meaning score that sends a clip up ('inf': none goes).",
        panel=_D)], None),
    "gate_verify": (Annotated[float | None, _opt(
        "--gate-verify", help="Verify meaning: the score that escalates a block once the cloud holds the clip.",
        panel=_D)], None),
}

# -- decoding: the preset and the speculative knobs (describe, batch) ----------------------------------


@dataclass(frozen=True)
class Decoding:
    preset: str
    presets_file: Path | None
    cloud_rtt_ms: float | None
    given: dict[str, Any]   # the decoding settings given, with the generation ones (None: not given)


DECODING_PARAMS = {
    "preset": (Annotated[str, _opt(help="Preset (see `specdec presets`); settings you give override it.",
                                   panel=_D, show_default=True)], "fluent"),
    "mode": (Annotated[Mode | None, _opt(help="spec: edge drafts, cloud verifies; edge / cloud: one model alone.",
                                         panel=_D)], None),
    "verify": (Annotated[Verify | None, _opt(
        help="entropy: uncertain blocks go to the cloud; always: every block (lossless); meaning: blocks unsure of "
        "what the sentence says (docs/meaning-gate.md).", panel=_D)], None),
    "threshold": (Annotated[float | None, _opt(
        help="Escalate a block when its uncertainty (nats) exceeds this; 'inf' never escalates.", panel=_D)], None),
    "k": (Annotated[int | None, _opt("--k", min=1, help="Draft block length.", panel=_D)], None),
    **GATE_PARAMS,
    "uncertainty": (Annotated[Uncertainty | None, _opt(help="How per-token entropies make a block's uncertainty.",
                                                       panel=_D)], None),
    "constraints": (Annotated[OnOff | None, _opt(help="The sentence's rules (CJK vocabulary, punctuation, loop "
                                                 "checks); off: plain decoding.", panel=_D)], None),
    "presets_file": (Annotated[Path | None, _opt(
        "--presets", help="A presets file (`specdec calibrate`'s) over the built-in one.", panel=_D)], None),
    "cloud_rtt_ms": (Annotated[float | None, _opt(
        min=0, help="A modelled round trip (ms): adds latency_modelled_s to records (never slept).",
        panel=_C)], None),
}


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The settings the user gave (None: not given); --constraints on/off as a bool."""
    return {k: (v is OnOff.on if isinstance(v, OnOff) else v) for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Group:
    keyword: str                                   # the parameter the command receives the object as
    params: dict[str, tuple[Any, Any]]             # name -> (Annotated type, default)
    build: Callable[[dict[str, Any]], Any]


MODELS = Group("models", MODELS_PARAMS, lambda v: Models(**v))
GENERATION = Group("generation", GENERATION_PARAMS, _given)
# eval: the generation options and the meaning gate's thresholds (for the modes on verify meaning).
EVAL_GENERATION = Group("generation", {**GENERATION_PARAMS, **GATE_PARAMS}, _given)
DECODING = Group("decoding", {**DECODING_PARAMS, **GENERATION_PARAMS}, lambda v: Decoding(
    v.pop("preset"), v.pop("presets_file"), v.pop("cloud_rtt_ms"), _given(v)))


def with_options(*groups: Group) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the groups' options to a command (after its own); it gets one object per group."""
    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        names = {g.keyword for g in groups}
        params = [p for p in own.parameters.values() if p.name not in names]
        for group in groups:
            params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
                       for name, (kind, default) in group.params.items()]

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            for group in groups:
                values[group.keyword] = group.build({name: values.pop(name) for name in group.params})
            return command(**values)

        run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run
    return wrap


# --segment, for the commands that describe recordings (describe, batch).
SegmentOpt = Annotated[bool, typer.Option(
    "--segment", help="Describe a recording of up to 4 h in segments of at most the model's window (30 s), cut "
    "where the speech pauses, each its own record.", rich_help_panel=_I)]

# What a clip does when its remote cloud fails it (describe, batch): describe.CloudPolicy. The
# defaults and why: docs/serve.md, "When the cloud cannot answer". An on-device model is expected
# to answer without the network, so the edge finishes the clip (marked) unless told to fail; the
# whole-clip deadline is one a person waits through for `describe`, and one that rides out a
# server restart (the 20 s retry window and a rebuild) for `batch`, where nobody waits per clip.
class OnCloudFailure(StrEnum):
    edge = "edge"
    fail = "fail"


DESCRIBE_DEADLINE_S = 10.0
BATCH_DEADLINE_S = 30.0
OnCloudFailureOpt = Annotated[OnCloudFailure, typer.Option(
    "--on-cloud-failure", help="When the cloud fails a clip (down, refusing, too slow): edge finishes it (its "
    "record's fallback says why); fail fails it.", rich_help_panel=_C, show_default=True)]


def cloud_deadline_opt(default_s: float) -> Any:
    return Annotated[float | None, typer.Option(
        "--cloud-deadline", metavar="SECONDS", help=f"The cloud's budget for a whole clip; past it, a cloud "
        f"failure (default: {default_s:g} with --on-cloud-failure edge, none with fail).", show_default=False,
        rich_help_panel=_C)]


DescribeDeadlineOpt = cloud_deadline_opt(DESCRIBE_DEADLINE_S)
BatchDeadlineOpt = cloud_deadline_opt(BATCH_DEADLINE_S)


def cloud_deadline(given: float | None, on_failure: OnCloudFailure, default_s: float) -> float | None:
    """The deadline a command runs with: the one given, else its default with edge, else none."""
    if given is not None:
        return given
    return default_s if on_failure is OnCloudFailure.edge else None


# Single shared options, for commands that take one of a group's options alone.
EdgeOpt = MODELS_PARAMS["edge"][0]
DtypeOpt = MODELS_PARAMS["dtype"][0]
PresetsFileOpt = DECODING_PARAMS["presets_file"][0]
