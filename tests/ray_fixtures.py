"""A local Ray for a test module (tests/test_ray_batch.py, tests/test_corpus_ray.py): started once on
loopback with a small object store, shut down at the module's end, and every process it started
checked gone (by pid: `ray stop` would end every Ray on the machine)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from specdec_cli.scale import ray_batch


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (Linux /proc), to check the module leaves none behind."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by its parent) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def local_ray(request):
    ray = pytest.importorskip("ray")
    before = descendants(os.getpid())
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR,
             object_store_memory=ray_batch.OBJECT_STORE_BYTES, log_to_driver=False)
    started = descendants(os.getpid()) - before
    assert started, "ray.init started no process"
    ray.cloudpickle.register_pickle_by_value(request.module)  # workers cannot import tests/
    yield
    ray.shutdown()
    deadline = time.monotonic() + 30
    while (left := {p for p in started if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"Ray processes left running after shutdown: {sorted(left)}"
