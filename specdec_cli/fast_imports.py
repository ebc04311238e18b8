"""Start-up: keep transformers quiet without importing it, and import it without scanning its
models folder twice.

Both are workarounds around library internals, each checked against the library's own result in
tests/test_fast_imports.py; each falls back to the library's plain behaviour when its internals
are not what we expect.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def debugging() -> bool:
    """SPECDEC_DEBUG=1: tracebacks and the libraries' own output are kept."""
    return os.environ.get("SPECDEC_DEBUG", "") not in ("", "0")


def quiet_libraries() -> None:
    """Keep stderr to specdec's own lines: no weight-loading bars or advisory warnings from
    transformers (unless SPECDEC_DEBUG is set)."""
    if not debugging():
        quiet_transformers()


def quiet_transformers() -> None:
    """Errors only, no progress bars, from transformers and the Hub client. Before transformers is
    imported this only sets the environment variables both libraries read at import time (importing
    transformers here would cost `specdec --help` and a mistyped path seconds); once it is imported,
    the same through its logging API."""
    if "transformers" not in sys.modules:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def import_transformers() -> Any:
    """`import transformers`, sharing one scan of transformers/models between the two places that
    make it.

    `transformers/__init__.py` builds its lazy import table from `define_import_structure(models
    dir, prefix="models")`, and `transformers/models/__init__.py` then builds its own from
    `define_import_structure(<models/__init__.py>)`: the same folder (a file stands for its parent),
    but an lru_cache key that differs, so ~1100 files are read and parsed twice (about half a
    second on a quiet machine, seconds on a loaded one). The second call's answer is the first's
    with the "models." prefix taken off; we give it that, and nothing else changes."""
    import transformers

    if "transformers.models" in sys.modules:
        return transformers  # too late (or already done): nothing to share
    from transformers.utils import import_utils

    original = import_utils.define_import_structure
    if getattr(original, "_specdec_shared", False):
        return transformers
    models_dir = Path(transformers.__file__).parent / "models"
    models_init = str(models_dir / "__init__.py")

    def shared(module_path: Any, prefix: str | None = None) -> Any:
        if prefix is None and str(module_path) == models_init:
            prefixed = original(models_dir, prefix="models")  # cached: transformers/__init__ made it
            # Only the "models." entries: transformers/__init__ adds its own top-level names to the
            # cached dict after the scan (`import_structure[frozenset()].update(...)`).
            return {backends: {name.removeprefix("models."): set(objs) for name, objs in table.items()
                               if name.startswith("models.")}
                    for backends, table in prefixed.items()}
        return original(module_path, prefix)

    shared._specdec_shared = True  # type: ignore[attr-defined]
    shared.__wrapped__ = original  # type: ignore[attr-defined]  # the library's own, for the tests
    shared.cache_clear = original.cache_clear  # type: ignore[attr-defined]  # the API it replaces has it
    import_utils.define_import_structure = shared
    return transformers
