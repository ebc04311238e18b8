"""`specdec batch --ray`: the clips spread over Ray actors, the records streamed back to the one writer.

Who does what:
  * The driver (the `specdec batch` process) keeps everything batch.py guarantees: it alone opens and
    writes the results file (batch.ResultsFile: one writer, append + fsync as each clip ends, resume
    only under equal settings). It starts or joins Ray, starts the workers, hands each at most
    `DEPTH` clips at a time (so a worker never waits for the next clip to cross the network) and
    yields (clip, record) to `batch.run_batch` as each record comes back, in any order. It never
    loads a model.
  * A worker is a Ray actor, one process: it loads the pair once (`make_session`: a pair.BatchWorker,
    given the settings the driver resolved, so every worker decodes exactly as the driver would) and
    turns clips into records with `Pair.describe_many`, the code a single-process batch runs. A bad
    clip comes back as its error record, as it does there.

Where the audio is read:
  * shared path (the default with `--ray auto`, all workers on this machine): each worker reads the
    clip file itself, by its absolute path;
  * shipped (the default with `--ray ADDRESS`, whose workers may be on machines that cannot see this
    disk): the driver reads each clip and sends its bytes with the task. `--shared-path` says DIR is
    mounted at the same path on every node (NFS, a bucket mount) and leaves the reading to the workers.
  Either way only the clips in flight (workers x DEPTH) are held in memory, and the record names the
  clip as the driver was given it, so resume and equality with a single-process run key on the same
  path.

Faults, handled by Ray's own machinery:
  * A worker process that dies in the middle of a clip (killed, out of memory, its node lost): Ray
    restarts the actor (`max_restarts`; the new process loads the pair again) and runs its unfinished
    tasks again there (`max_task_retries`). A task's result reaches the driver once however often it
    ran, so each clip is written once.
  * A clip whose worker keeps dying past those retries: the driver gets a RayActorError and runs
    each clip of that task once more, alone on an idle worker (the worker may have died of another
    clip in its queue); a clip that kills its worker alone too is recorded as an error (a rerun
    retries it).
  * A worker that cannot start (no model folder on its node, another specdec version): the others go
    on; with none left the run stops with the reason, and a rerun resumes.
  * The driver killed: the results file is what a single-process batch leaves (rerun to resume). The
    actors belong to the driver's job, so Ray ends them with it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from .. import __version__
from ..errors import InputError, SpecdecError, one_line
from ..inputs import clips as count_clips

INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'specdec-omni[ray]'"

DEPTH = 2                # tasks handed to one worker at a time: one decoding, one waiting
MAX_RESTARTS = 16        # how often Ray restarts one worker process that died (per worker, per run)
MAX_TASK_RETRIES = 2     # how often Ray runs a clip again after its worker died under it
RESUBMITS = 1            # after that, how often the driver runs the clip again, alone
CONNECT_TIMEOUT_S = 5.0  # for the check that something listens at --ray ADDRESS
# A local Ray's shared-memory object store: only clips in flight pass through it (Ray's floor is 75 MiB).
OBJECT_STORE_BYTES = 96 * 1024 * 1024


LOOPBACK_ENV = "SPECDEC_RAY_LOOPBACK"  # set in a Ray private_local_ray started: its processes stay on loopback


def ray_environment() -> None:
    """What Ray reads once, when it is imported (ray_constants): set before the first `import ray`
    of this process. No usage statistics leave the machine; each log line of a worker shows as it
    came, not folded into `[repeated 18x across cluster]` (a fleet's access lines). And the
    `(ServeReplica:cloud pid=…)` prefix the driver puts before each worker line is coloured only on
    a terminal: in a log file (`specdec serve --replicas 2 2> serve.log`) its escape codes were
    noise (Ray reads RAY_COLOR_PREFIX as it prints; NO_COLOR turns it off on a terminal too)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not _terminal() or os.environ.get("NO_COLOR"):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def _terminal() -> bool:
    """Whether both of this process's output streams are terminals (Ray prints workers' lines to
    either, as they were written)."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


TOKEN_FOLDER = "specdec-ray-"  # + the owner's pid + "-" + random: a private local Ray's token folder


def remove_orphan_token_folders(where: Path | None = None) -> list[Path]:
    """Remove the token folders (private_local_ray) of this user's processes that are gone: one
    killed with SIGKILL never reached its `finally` (issue 55: the folder, its token 0600 inside,
    stayed). A folder whose pid is alive (ours, or a pid reused since) is kept. The ones removed."""
    import shutil
    import tempfile

    removed = []
    for folder in Path(where or tempfile.gettempdir()).glob(f"{TOKEN_FOLDER}*-*"):
        pid = folder.name[len(TOKEN_FOLDER):].split("-", 1)[0]
        try:
            if not pid.isdigit() or folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except OSError:  # alive under another user (EPERM), or the folder went meanwhile
            continue
    return removed


@contextmanager
def private_local_ray() -> Iterator[None]:
    """Around `ray.init(address="local")` and the Ray's whole life: a Ray this process starts for
    itself listens on loopback only, and its auth token is a private file removed afterwards.

    Why by hand: Ray 2.60 binds its GCS, raylet, workers and agents to the node's address, which it
    takes from the network (not 127.0.0.1, even when told so: `resolve_ip_for_localhost`) unless
    `ENABLE_RAY_CLUSTER` is off (its setting for a machine that is no cluster's node); and a new
    local Ray writes a fresh token to ~/.ray/auth_token, readable by everyone (0644), and leaves it
    behind. Here the token is ours, 0600 in a 0700 folder (named with this process's pid: a later
    start removes it if this process was killed before its end), named by RAY_AUTH_TOKEN_PATH (which the
    processes Ray starts inherit), with RAY_AUTH_MODE=token (Config.initialize and the token
    loader's reset_cache: Ray caches both, as its own `_enable_token_auth` knows)."""
    import secrets
    import shutil
    import tempfile

    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    remove_orphan_token_folders()
    folder = Path(tempfile.mkdtemp(prefix=f"{TOKEN_FOLDER}{os.getpid()}-"))  # 0700
    token = folder / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    keys = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", LOOPBACK_ENV)
    saved, cluster = {key: os.environ.get(key) for key in keys}, ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                       "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", LOOPBACK_ENV: "1"})
    ray_constants.ENABLE_RAY_CLUSTER = False  # node address: 127.0.0.1 (services.get_node_ip_address)
    Config.initialize("")
    # Forget a "no token" cached by an earlier look (importing Ray Serve takes one): ray.init would
    # otherwise write a fresh ~/.ray/auth_token beside ours.
    AuthenticationTokenLoader.instance().reset_cache()
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        ray_constants.ENABLE_RAY_CLUSTER = cluster
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def require_ray() -> ModuleType:
    """The `ray` module, or the one-line install hint (exit 2) when the extra is not installed."""
    ray_environment()
    try:
        import ray
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        raise InputError(INSTALL_HINT) from None
    return ray


@dataclass(frozen=True)
class RayOptions:
    """What `--ray`, `--workers`, `--gpus-per-worker` and `--ship-audio/--shared-path` asked for."""

    address: str                     # "auto": a Ray of its own on this machine; else a cluster's address
    workers: int | None = None       # None: as many as the cluster has room for
    gpus_per_worker: float = 0.0
    ship_audio: bool | None = None   # None: ship unless auto

    @property
    def local(self) -> bool:
        return self.address == "auto"

    @property
    def ships_audio(self) -> bool:
        return (not self.local) if self.ship_audio is None else self.ship_audio


class ClipSession(Protocol):
    """What a worker holds: the loaded pair and the resolved settings (pair.BatchWorker). This
    module knows it only by these calls, so it stays below the service layer that provides it."""

    def rows(self, batch_size: int) -> int: ...

    def describe(self, files: list[str], read: Callable[[Path], bytes] | None,
                 batch_size: int) -> list[tuple[str, dict[str, Any]]]: ...

    def error_record(self, file: str, message: str) -> dict[str, Any]: ...


# What `describe_all` returns: given the clips still to do, yields (clip, record) as each clip ends
# (results.run_batch's describe_all).
DescribeAll = Callable[[list[Path]], Iterator[tuple[Path, dict[str, Any]]]]


@dataclass(frozen=True)
class WorkerEvent:
    """A worker's news for the driver's user: ready, restarted (by Ray, after its process died),
    failed (could not start), lost (died for good)."""

    index: int
    kind: str
    pid: int | None = None
    host: str | None = None
    detail: str = ""


class PairWorker:
    """One worker process holding one loaded pair. Wrapped with `ray.remote` when a run starts, so
    this module imports without Ray (for the install hint). A failure to load is kept, not raised:
    the driver reads it from `info()` and says it in one line instead of Ray's traceback."""

    def __init__(self, make_session: Callable[[], ClipSession]) -> None:
        self.failure: str | None = None
        try:
            self.session = make_session()
        except Exception as exc:
            self.failure = one_line(exc)

    def info(self, batch_size: int) -> tuple[int, str, str, str | None, int]:
        """(pid, host, specdec version, why the pair did not load or None, how many clips it decodes
        together at `batch_size`: 1 where this run cannot batch, e.g. a remote cloud)."""
        rows = 1 if self.failure is not None else self.session.rows(batch_size)
        return os.getpid(), socket.gethostname(), __version__, self.failure, rows

    def describe(self, files: list[str], sources: list[bytes | str | Exception],
                 batch_size: int) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
        """Each clip's record, as the driver's process would make it (`batch_size` rows in flight
        where this run can batch, else one at a time), and this process's pid (the driver notices
        a restarted worker by it). `sources[i]`: clip i's bytes, a path to read them from, or why
        the driver could not read them; the record names the clip as the driver was given it."""
        where = {Path(f): s for f, s in zip(files, sources, strict=True)}

        def read(path: Path) -> bytes:
            source = where[path]
            if isinstance(source, Exception):
                raise source
            return source if isinstance(source, bytes) else _read(path, Path(source))

        return os.getpid(), self.session.describe(files, read, batch_size)

    def error_record(self, file: str, message: str) -> dict[str, Any]:
        return self.session.error_record(file, message)


def _read(path: Path, where: Path) -> bytes:
    try:
        return where.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path} on {socket.gethostname()} ({where}): "
                         f"{exc.strerror or exc}") from None


def describe_all(options: RayOptions, make_session: Callable[[], ClipSession], batch_size: int = 1,
                 on_event: Callable[[WorkerEvent], None] | None = None) -> DescribeAll:
    """`batch.run_batch`'s describe_all for a Ray run. `make_session` is called once in each worker
    process (so it must pickle: a module-level function, or a partial of one); `batch_size`: rows
    in flight in each worker (--batch-size), where the run can batch."""
    ray = require_ray()

    def run(clips: list[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
        if not clips:
            return
        with _connected(ray, options):
            pool = _Pool(ray, options, make_session, batch_size, on_event or (lambda event: None))
            yield from pool.run(clips)

    return run


@contextmanager
def _connected(ray: ModuleType, options: RayOptions) -> Iterator[None]:
    """Start a local Ray (`auto`) or join a cluster, and leave it as found. A process that already
    called ray.init (a notebook, a test module) keeps its connection and its Ray."""
    if ray.is_initialized():
        yield
        return
    debug = os.environ.get("SPECDEC_DEBUG", "") not in ("", "0")
    # Our own one-line messages replace Ray's worker logs on stderr, unless debugging.
    quiet = {"logging_level": logging.DEBUG if debug else logging.ERROR, "log_to_driver": debug}
    if options.local:
        cpus = max(options.workers or 0, os.cpu_count() or 1)
        with private_local_ray():
            ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                     object_store_memory=OBJECT_STORE_BYTES, **quiet)
            try:
                yield
            finally:
                ray.shutdown()
        return
    check_reachable(options.address)
    try:
        ray.init(address=options.address, **quiet)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        # Ray's own stderr lines say why; the one we meet most: a head started with token
        # authentication (Ray's default) and a driver that was not told to send the token.
        raise InputError(f"cannot join the Ray cluster at {options.address} ({one_line(exc)}); if Ray's "
                         "lines above say InvalidAuthToken, export RAY_AUTH_MODE=token with the head's "
                         "~/.ray/auth_token in place; or use --ray auto") from None
    try:
        yield
    finally:
        ray.shutdown()


def check_reachable(address: str) -> None:
    """Refuse an address nothing listens on, at once: ray.init would retry it for minutes, printing
    warnings. (Only the TCP connect; whether it is a Ray is ray.init's to find out.)"""
    hint = "start one with `ray start --head` and give the address it prints, or use --ray auto"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--ray takes auto, HOST:PORT or ray://HOST:PORT, not {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise InputError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); {hint}") from None


@dataclass
class _Worker:
    actor: Any
    pid: int | None = None
    host: str | None = None
    ready: bool = False
    alive: bool = True
    busy: int = 0          # tasks handed over and not yet back
    unanswered: int = 0    # pings in a row that failed
    isolated: bool = False  # running a suspect clip, and nothing else


class _Pool:
    """The driver's side: start the workers, keep each fed, collect records as they end.

    A task is a chunk of clips: one clip when workers decode one at a time (batch size 1, or a run
    that cannot batch, as the workers' info says); with rows in flight, up to twice the batch size, so rows that end early are refilled from the same chunk (fewer when
    the clips left would not go round every worker's slots). Records come back when their chunk ends.

    A clip handed back after its worker died past Ray's retries is a suspect: the worker that died
    may have died of another clip in its queue. Each suspect runs again alone on an idle worker that
    gets nothing else meanwhile (one worker stops taking new chunks until it is idle), so a clip is
    recorded as failed only when it killed a worker that held nothing but it."""

    def __init__(self, ray: ModuleType, options: RayOptions, make_session: Callable[[], ClipSession],
                 batch_size: int, on_event: Callable[[WorkerEvent], None]) -> None:
        self.ray, self.options, self.batch_size, self.on_event = ray, options, batch_size, on_event
        count = _worker_count(ray, options)
        actor_class = ray.remote(PairWorker).options(
            num_cpus=1, num_gpus=options.gpus_per_worker, max_restarts=MAX_RESTARTS,
            max_task_retries=MAX_TASK_RETRIES)
        self.workers = [_Worker(actor_class.remote(make_session)) for _ in range(count)]
        self.pings = {w.actor.info.remote(batch_size): i for i, w in enumerate(self.workers)}  # -> worker
        self.running: dict[Any, tuple[int, list[Path]]] = {}                         # ref -> (worker, clips)
        self.todo: deque[Path] = deque()
        self.suspects: deque[Path] = deque()   # handed back after a worker died: each runs alone
        self.given_back = Counter[Path]()
        self.last_failure = ""
        self.rows = 1  # clips a worker decodes together (its info says), so the chunk size

    def run(self, clips: list[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
        self.todo.extend(clips)
        try:
            while self.todo or self.suspects or self.running:
                self._hand_out()
                if not self.running and not self.pings:
                    left = len(self.todo) + len(self.suspects)
                    raise SpecdecError(f"no Ray worker left to describe {count_clips(left)} ({self.last_failure}); "
                                       "the results so far are kept: rerun to resume")
                [ref], _ = self.ray.wait([*self.running, *self.pings], num_returns=1)
                if ref in self.pings:
                    self._ping_answered(ref)
                    continue
                index, chunk = self.running.pop(ref)
                self.workers[index].busy -= 1
                yield from self._records(ref, index, chunk)
        finally:
            for worker in self.workers:  # ours alone; a cluster's other jobs are untouched
                self.ray.kill(worker.actor, no_restart=True)

    def _chunk(self) -> list[Path]:
        size = 1
        if self.rows > 1:  # every slot of every live worker gets a share of what is left
            slots = DEPTH * (sum(w.alive for w in self.workers) or 1)
            size = max(1, min(2 * self.rows, -(-len(self.todo) // slots)))
        return [self.todo.popleft() for _ in range(min(size, len(self.todo)))]

    def _hand_out(self) -> None:
        usable = [i for i, w in enumerate(self.workers) if w.ready and not w.isolated]
        drain = usable[0] if self.suspects and usable else None  # left to go idle for the next suspect
        for index in usable:
            worker = self.workers[index]
            if index == drain:
                if worker.busy == 0:
                    self._submit(index, [self.suspects.popleft()])
                    worker.isolated = True
                continue
            while self.todo and worker.busy < DEPTH:
                self._submit(index, self._chunk())

    def _submit(self, index: int, chunk: list[Path]) -> None:
        worker = self.workers[index]
        ref = worker.actor.describe.remote([str(c) for c in chunk], [self._source(c) for c in chunk],
                                           self.batch_size)
        self.running[ref] = (index, chunk)
        worker.busy += 1

    def _source(self, clip: Path) -> bytes | str | Exception:
        where = Path(os.path.abspath(clip))  # workers need not share the driver's current directory
        if not self.options.ships_audio:
            return str(where)
        try:
            return where.read_bytes()
        except OSError as exc:
            return InputError(f"cannot read {clip}: {exc.strerror or exc}")

    def _ping_answered(self, ref: Any) -> None:
        index = self.pings.pop(ref)
        worker = self.workers[index]
        try:
            pid, host, version, failure, rows = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:
            # A ping fails too when the worker dies under a clip while the ping waits its turn (it
            # shares the retries); only a worker past its restarts keeps failing them, at once.
            worker.unanswered += 1
            if worker.unanswered <= MAX_RESTARTS + 1:
                self.pings[worker.actor.info.remote(self.batch_size)] = index
            else:
                self._lost(index, "failed" if worker.pid is None else "lost", one_line(exc))
            return
        worker.unanswered = 0
        if failure is None and version != __version__:
            failure = (f"specdec {version} on {host}, {__version__} here: install the same version on every "
                       "node (records carry the version)")
        if failure is not None:
            self._lost(index, "failed", failure, pid, host)
            self.ray.kill(worker.actor, no_restart=True)
            return
        restarted = worker.pid is not None and pid != worker.pid
        worker.pid, worker.host, worker.ready = pid, host, True
        self.rows = rows  # every worker runs the same settings
        self.on_event(WorkerEvent(index, "restarted" if restarted else "ready", pid, host))

    def _records(self, ref: Any, index: int, chunk: list[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
        """The chunk's records; none for clips that went back into the queue."""
        worker, exceptions = self.workers[index], self.ray.exceptions
        worker.isolated = False  # an isolated worker's one task is this one
        try:
            pid, records = self.ray.get(ref)
        except exceptions.RayActorError as exc:
            # Ray restarted this worker and ran the chunk again MAX_TASK_RETRIES times, and it still
            # died (or Ray gave the worker up). Ask the worker whether it lives; each clip becomes a
            # suspect (see the class doc); one that killed its worker alone too is recorded as failed.
            if worker.ready and worker.alive:
                worker.ready = False
                self.pings[worker.actor.info.remote(self.batch_size)] = index
            for clip in chunk:
                if self.given_back[clip] < RESUBMITS:
                    self.given_back[clip] += 1
                    self.suspects.append(clip)
                else:
                    yield clip, self._error_record(clip, f"its Ray worker died every time it ran ({one_line(exc)}); "
                                                         "rerun to retry it")
            return
        except exceptions.RayTaskError as exc:  # the workers catch each clip's own errors
            for clip in chunk:
                yield clip, self._error_record(clip, f"Ray worker error: {one_line(exc.as_instanceof_cause())}")
            return
        if worker.pid is not None and pid != worker.pid:  # a new process: Ray restarted it meanwhile
            worker.pid = pid
            self.on_event(WorkerEvent(index, "restarted", pid, worker.host))
        by_file = dict(records)
        for clip in chunk:  # each clip of the chunk once, named as the driver gave it
            yield clip, by_file[str(clip)]

    def _error_record(self, clip: Path, message: str) -> dict[str, Any]:
        """Built by a live worker's session, so it carries what every other record carries (one
        being restarted answers once it is back)."""
        for worker in self.workers:
            if worker.alive:
                try:
                    return self.ray.get(worker.actor.error_record.remote(str(clip), message))
                except self.ray.exceptions.RayError:
                    continue
        raise SpecdecError(f"no Ray worker left to record {clip} ({message}); rerun to resume")

    def _lost(self, index: int, kind: str, detail: str, pid: int | None = None, host: str | None = None) -> None:
        worker = self.workers[index]
        worker.alive = worker.ready = False
        self.last_failure = f"worker {index + 1}: {detail}"
        self.on_event(WorkerEvent(index, kind, pid or worker.pid, host or worker.host, detail))


def _worker_count(ray: ModuleType, options: RayOptions) -> int:
    """--workers, or as many as the cluster holds (by GPUs with --gpus-per-worker, else by CPUs);
    refused when the cluster cannot hold them, since Ray would leave the rest waiting for ever."""
    have = ray.cluster_resources()
    cpus, gpus = int(have.get("CPU", 0)), float(have.get("GPU", 0))
    per_gpu = options.gpus_per_worker
    fits = min(cpus, int(gpus // per_gpu)) if per_gpu > 0 else cpus
    wanted = options.workers or max(fits, 1)
    if wanted > fits:
        room = f"{cpus} CPUs" + (f" and {gpus:g} GPUs" if per_gpu > 0 else "")
        need = f"1 CPU{f' and {per_gpu:g} GPUs' if per_gpu > 0 else ''} each"
        raise InputError(f"the Ray cluster has room for {fits} workers ({room}; a worker takes {need}), "
                         f"not {wanted}: give fewer --workers, or add nodes")
    return wanted

