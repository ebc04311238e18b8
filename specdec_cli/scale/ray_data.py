"""A Parquet corpus described past one machine with Ray Data: read_parquet -> map_batches over an actor
pool -> write_parquet (corpus.caption_with_ray is the public call; docs/corpus.md).

Everything a long run needs is Ray Data's own, not made here: it streams the rows through a bounded
number of batches in flight (memory stays flat whatever the corpus' size), slows the reading when
the actors fall behind (backpressure), restarts an actor whose process died (`max_restarts`) and
reruns the batches it held (`max_task_retries`), and writes each output block as its own file.
This module only wires the pipeline: which callable runs in the actors is given (a corpus.Captioner,
which loads its pair once per actor), so scale/ stays below the service layer that provides it.

Unlike `specdec batch`, a Ray Data run does not resume: a run that fails is run again whole
(write_parquet refuses a destination that exists unless `overwrite`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputError
from .ray_batch import MAX_RESTARTS, MAX_TASK_RETRIES, RayOptions, _connected, _worker_count, require_ray

DATA_INSTALL_HINT = "Ray Data needs pyarrow and pandas beside Ray: pip install 'specdec-omni[corpus,ray]'"


class PoolActor:
    """One actor of the pool: holds the callable it was given, loaded once in this process
    (`udf.load()` when it has one: the pair, before the first batch arrives)."""

    def __init__(self, udf: Callable[[Any], Any]) -> None:
        self.udf = udf
        load = getattr(udf, "load", None)
        if load is not None:
            load()

    def __call__(self, batch: Any) -> Any:
        return self.udf(batch)


def actor_cpus(cpus: float, workers: int) -> float:
    """The logical CPUs each of `workers` actors asks for on a cluster of `cpus`: 1, unless the pool
    would then hold every CPU slot. Ray Data starts the actors before its read and write tasks, and
    with no slot left for those the dataset hangs for ever (ray-project/ray#44687; here a 2-CPU
    local Ray and 2 workers waited in write_parquet with both actors idle). So the pool leaves one
    slot: its actors share the rest (the processes still use what the OS gives them)."""
    if cpus <= 0 or workers * 1.0 <= cpus - 1:
        return 1.0
    return max(0.0, (cpus - 1) / workers)


def map_parquet(options: RayOptions, source: str | list[str], destination: str, udf: Callable[[Any], Any],
                rows_per_batch: int = 64, preserve_order: bool = True, overwrite: bool = False) -> None:
    """`read_parquet(source)` -> `map_batches(udf)` on `options.workers` actors (Arrow batches of
    `rows_per_batch` rows) -> `write_parquet(destination)`, on the Ray `options` names."""
    if "://" not in destination and Path(destination).exists() and not overwrite:
        # Said at once: Ray Data would find it only once the first rows were described.
        raise InputError(f"{destination} exists; give another destination, or overwrite=True to replace it")
    ray = require_ray()
    try:
        import ray.data
        from ray.data._internal.savemode import SaveMode
    except ImportError as exc:
        raise InputError(f"{DATA_INSTALL_HINT} ({exc})") from None
    with _connected(ray, options):
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = preserve_order
        workers = _worker_count(ray, options)
        extra = {"num_gpus": options.gpus_per_worker} if options.gpus_per_worker else {}
        cpus = float(ray.cluster_resources().get("CPU", 0))
        rows = ray.data.read_parquet(source)
        described = rows.map_batches(
            PoolActor, fn_constructor_args=(udf,), batch_size=rows_per_batch, batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=actor_cpus(cpus, workers),
            max_restarts=MAX_RESTARTS, max_task_retries=MAX_TASK_RETRIES, **extra)
        described.write_parquet(destination, mode=SaveMode.OVERWRITE if overwrite else SaveMode.ERROR)
