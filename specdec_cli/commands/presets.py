"""`specdec presets`: the presets, their values and where each comes from."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from ..models import presets_file_for
from ..presets import check_presets_file, load_presets, shown
from ..strict_json import dumps_record
from . import ui
from .options import EdgeOpt, PresetsFileOpt


def presets(
    edge: EdgeOpt = None,
    presets_file: PresetsFileOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the presets as one JSON object.")] = False,
) -> None:
    """List the presets, their values and where each comes from (configs/, the model folder or --presets)."""
    files = [presets_file_for(edge), check_presets_file(presets_file)]
    merged = load_presets(files)
    if json_out:
        data = {name: {**p.values, "source": p.source, "description": p.description} for name, p in merged.items()}
        sys.stdout.write(dumps_record(data) + "\n")
        return
    out = Console(highlight=False)
    out.print(ui.presets_table(merged, load_presets(None)))
    from ..gate_presets import gate_file, load_gate  # numpy: only here, after the table's imports

    if (path := gate_file(files)) is not None and (gate := load_gate(path)) is not None:
        out.print(ui.gate_line(gate, shown(path)))  # wrapped at spaces, as the table is
