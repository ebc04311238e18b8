"""Fixtures for the CLI tests: the tiny model pair saved once per session. Test modules load this
file as a plugin (`pytest_plugins = ["cli_fixtures"]`), so the session fixtures are shared."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import make_thinker

torch.set_num_threads(1)


def save_pair(root: Path, tokenizer, processor) -> tuple[str, str]:
    """The conftest's tiny edge and cloud, saved as model folders the CLI can load."""
    sizes = {"edge": (1, {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "audio_d": 32}),
             "cloud": (2, {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "audio_d": 32})}
    for name, (seed, kw) in sizes.items():
        model = make_thinker(tokenizer, seed, **kw)
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
    return str(root / "edge"), str(root / "cloud")


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory, tokenizer, processor) -> tuple[str, str]:
    """(edge dir, cloud dir), written once per session (test modules load this file as a plugin)."""
    return save_pair(tmp_path_factory.mktemp("tiny_pair"), tokenizer, processor)


@pytest.fixture(scope="session")
def models(tiny_pair) -> list[str]:
    """The model options every command under test gets."""
    return ["--edge", tiny_pair[0], "--cloud", tiny_pair[1]]
