"""The command line: thin shells over the library (`specdec_cli.pair` and below). app.py holds the
Typer app and maps errors to exit codes; options.py declares the shared options once; one module
per command, registered here; ui.py and plots.py are views that consume what the library returns."""

from . import batch, calibrate, describe, eval, presets, serve
from .app import app

app.command()(describe.describe)
app.command()(batch.batch)
app.command("presets")(presets.presets)
app.command()(serve.serve)
app.command("eval")(eval.evaluate_command)
app.command("calibrate")(calibrate.calibrate)
