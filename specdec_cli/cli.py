"""The console-script entry point under its old name: `specdec = specdec_cli.cli:main` is what
installs made before the commands moved to `specdec_cli/commands/` still call."""

from .commands.app import app, main

__all__ = ["app", "main"]
