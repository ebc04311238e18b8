"""Corpora in, corpora out: a Hugging Face dataset or Parquet with an audio column, each row described,
and the same rows written back with the record's fields as extra columns.

Three routes share the pieces below (docs/corpus.md):
  * `specdec batch DATASET --out captions.parquet` (or a folder): `open_corpus` reads the input (a
    `Dataset.save_to_disk` folder, Parquet files, an `audiofolder`), `CorpusResults` is the one
    writer of the output and makes it resume as the JSON Lines results file does (results.py),
    `caption_corpus` describes the rows still to do with the batched decoding path.
  * `Dataset.map(Captioner(...), batched=True)`: a picklable callable that loads the pair once per
    process and returns each batch with the record's columns added.
  * Ray Data (`caption_with_ray`): read_parquet -> map_batches over an actor pool of Captioners ->
    write_parquet (scale/ray_data.py), Ray Data's own streaming, backpressure and retries.

The audio is decoded from the bytes in the rows (audio.py, as a clip file's bytes are): no temporary
files, no copy of the corpus in a cache. A row whose audio has no bytes is read from its path.

The record's fields become columns generically: `RecordColumns` takes their names and Arrow types
from two records of the run's shape built by records.py itself (`template_records`), so a field
someone adds to the records appears in every route's output without a change here, and every
batch, process and Ray worker writes one schema (a column that is null in one batch and a number in
the next would not concatenate).

How the output resumes (`CorpusResults`): each finished row's record is appended to a journal
beside the output (`.NAME.specdec.jsonl`, or `.specdec.jsonl` inside an output folder), flushed
and fsync'd before the next one, exactly as a JSON Lines results file is; a kill loses at most the
rows in flight. The Parquet output is written once every row has a record: streamed from the input
and the journal into a temporary file (each part file of a folder likewise), fsync'd and renamed
over the old one, and the journal is then removed, so a finished run leaves the output alone. The
output's Parquet metadata carries the run's stamp (settings, input, columns); a rerun refuses an
output or a journal made with other settings or from another input, or a file that is not ours, and
otherwise goes on from the journal (or from the output's own columns once the journal is gone),
retrying the rows that failed. Rows are matched by their position in the input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError, SpecdecError
from .results import _fsync_dir, _keep_backup, _write_atomically, backup_path, refusal
from .settings import RunSettings, differences
from .strict_json import dumps_record, json_safe
from .writer_lock import LockHeld, WriterLock

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from .pair import Pair
    from .settings import PairSpec, Settings

INSTALL_HINT = "reading and writing datasets needs the corpus extra: pip install 'specdec-omni[corpus]'"

READ_ROWS = 64            # input rows read at a time (and written as one Parquet row group)
ROWS_PER_PART = 1000      # rows per file of a folder output (part-00000.parquet, …)
STAMP_KEY = b"specdec"    # the output's Parquet metadata key holding the run's stamp
JOURNAL_IN_FOLDER = ".specdec.jsonl"
JOURNAL_ROW_START = b'{"row": '  # every journal line after the header starts so
# A clip over the model's window cannot be cut into segments on this route (--segment takes files).
TOO_LONG_HINT = "cut the dataset's audio into clips within the window first (--segment takes a folder of recordings)"


def require_datasets() -> None:
    """The corpus extra (datasets, and pyarrow with it), or the one-line install hint (exit 2)."""
    try:
        import datasets  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("datasets", "pyarrow"):
            raise
        raise InputError(INSTALL_HINT) from None
    _quiet_datasets()


def _quiet_datasets() -> None:
    # Our own progress replaces datasets' bars ("Resolving data files", "Loading dataset shards").
    from datasets.utils.logging import disable_progress_bar, set_verbosity_error

    disable_progress_bar()
    set_verbosity_error()


# -- where the rows come from --------------------------------------------------------------------

def output_kind(out: str | Path) -> str:
    """What --out names: "parquet" (NAME.parquet), "folder" (an existing folder, or a name ending
    in /: part files), else "jsonl" (JSON Lines, as before: NAME.jsonl whatever it is, `-` stdout)."""
    text = str(out)
    if text == "-" or text.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"  # whatever is there (a folder named r.jsonl is refused as a results file, as before)
    if text.endswith(".parquet"):
        return "parquet"
    if text.endswith(("/", os.sep)) or Path(text).is_dir():
        return "folder"
    return "jsonl"


def is_dataset(path: Path) -> bool:
    """Whether `path` is a dataset rather than a folder of audio files: a Parquet file, a folder
    written by `save_to_disk`, or a folder holding Parquet files. (An audiofolder is a folder of
    audio files too; it is read as a dataset when the output is Parquet.) A path that cannot be
    looked up (a name too long, a folder not searchable) is not one: the folder-of-audio route
    says what is wrong with it, in one line."""
    try:
        if path.is_file():
            return path.suffix == ".parquet"
        if not path.is_dir():
            return False
        return _saved(path) or bool(_parquet_files(path))
    except OSError:
        return False


def _saved(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or ((path / "state.json").is_file()
                                                     and (path / "dataset_info.json").is_file())


def _parquet_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.parquet")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))


@dataclass
class Corpus:
    """A dataset opened for describing: its input columns (`schema`, with the Hugging Face
    features in its metadata), the column holding the audio, how many rows, and its rows in order
    in batches (Arrow tables, read as they are reached: memory-mapped or streamed from Parquet)."""

    path: Path
    kind: str                 # "parquet", "saved" (Dataset.save_to_disk) or "audiofolder"
    split: str | None
    schema: Any               # pa.Schema
    audio_column: str
    num_rows: int
    base: Path                # where a relative audio path is looked for
    _read: Callable[[int], Iterator[Any]]

    def batches(self, rows: int = READ_ROWS) -> Iterator[pa.Table]:
        """The rows in order, `rows` at a time, each batch with `schema`'s columns."""
        for table in self._read(rows):
            if table.num_rows:
                yield table

    def identity(self) -> dict[str, Any]:
        """What the output is stamped with to say which input its rows are (rows match by position)."""
        return {"input": str(self.path.resolve()), "kind": self.kind, "split": self.split,
                "audio_column": self.audio_column, "rows": self.num_rows}


def open_corpus(path: Path, split: str | None = None, audio_column: str | None = None) -> Corpus:
    """The dataset at `path`: a Parquet file, a folder of Parquet files (`split` chooses among
    train-*/test-* files as the Hub names them), a `Dataset.save_to_disk` folder (of a Dataset, or
    of a DatasetDict: `split` chooses), or an `audiofolder` (audio files, and metadata.csv or
    metadata.jsonl with a file_name column). `audio_column`: the column holding the audio (default:
    the one Audio column). Nothing is copied: Arrow files are memory-mapped, Parquet is read a row
    group at a time, an audiofolder's files are read as their rows are reached."""
    require_datasets()
    if not path.exists():
        raise InputError(f"no such file or folder: {path}; check the path")
    if path.is_file():
        if path.suffix != ".parquet":
            raise InputError(f"{path} is a file but not Parquet; `specdec batch` takes a folder of audio files, a "
                             "dataset folder (save_to_disk, an audiofolder, Parquet files) or a .parquet file")
        if split is not None:
            raise InputError(f"{path} holds no splits; leave out --split")
        return _open_parquet(path, [path], split, audio_column, path.parent)
    if _saved(path):
        return _open_saved(path, split, audio_column)
    files = _parquet_files(path)
    if files:
        return _open_parquet(path, _split_files(path, files, split), split, audio_column, path)
    return _open_audiofolder(path, split, audio_column)


def _split_files(folder: Path, files: list[Path], split: str | None) -> list[Path]:
    """The Parquet files of one split, told by their names as the Hub lays them out (datasets' own
    patterns: data/train-00000-of-00002.parquet, test/…); a folder with no splits is one."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    keep = {f.resolve() for f in files}
    by_split = {str(name): sorted(Path(f).resolve() for f in found if Path(f).resolve() in keep)
                for name, found in DataFilesDict.from_patterns(get_data_patterns(str(folder)),
                                                               base_path=str(folder)).items()}
    by_split = {name: found for name, found in by_split.items() if found}
    if not by_split:
        return sorted(keep)
    return _one_split(folder, by_split, split)[1]


def _one_split(where: Path, splits: dict[str, Any], split: str | None) -> tuple[str, Any]:
    """The split asked for, or the only one; (its name, what it holds)."""
    names = ", ".join(splits)
    if split is not None:
        if split not in splits:
            raise InputError(f"{where} has no split {split!r} (its splits: {names}); give one of them to --split")
        return split, splits[split]
    if len(splits) == 1:
        return next(iter(splits.items()))
    raise InputError(f"{where} holds {len(splits)} splits ({names}); choose one with --split")


def _open_parquet(path: Path, files: list[Path], split: str | None, audio_column: str | None,
                  base: Path) -> Corpus:
    import pyarrow.parquet as pq

    try:
        opened = [pq.ParquetFile(f) for f in files]
    except Exception as exc:  # pyarrow's errors for a damaged or foreign file, whatever their type
        raise InputError(f"cannot read {path} as Parquet ({str(exc).splitlines()[0]})") from None
    schema = opened[0].schema_arrow
    for f, other in zip(files[1:], opened[1:], strict=True):
        if not other.schema_arrow.remove_metadata().equals(schema.remove_metadata()):
            raise InputError(f"{f} has other columns than {files[0]}; give the files of one dataset "
                             f"(columns: {', '.join(schema.names)})")
    column = _audio_column(path, schema, audio_column)

    def read(rows: int) -> Iterator[pa.Table]:
        import pyarrow as pa

        for f in opened:
            for batch in f.iter_batches(batch_size=rows):
                yield pa.Table.from_batches([batch]).replace_schema_metadata(schema.metadata)

    rows = sum(f.metadata.num_rows for f in opened)
    return Corpus(path, "parquet", split, schema, column, rows, base, read)


def _open_saved(path: Path, split: str | None, audio_column: str | None) -> Corpus:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # a folder save_to_disk did not finish, or another version's
        raise InputError(f"cannot open {path} as a saved dataset ({str(exc).splitlines()[0]})") from None
    if isinstance(loaded, datasets.DatasetDict):
        split, loaded = _one_split(path, dict(loaded), split)
    elif split is not None:
        raise InputError(f"{path} holds one Dataset, not splits; leave out --split")
    ds = loaded.with_format("arrow")  # Arrow tables as stored: nothing decoded, the audio left as bytes
    schema = loaded.features.arrow_schema
    column = _audio_column(path, schema, audio_column)

    def read(rows: int) -> Iterator[pa.Table]:
        for table in ds.iter(batch_size=rows):
            yield table.replace_schema_metadata(schema.metadata)

    return Corpus(path, "saved", split, schema, column, loaded.num_rows, path, read)


def _open_audiofolder(path: Path, split: str | None, audio_column: str | None) -> Corpus:
    """datasets' own audiofolder builder (metadata.csv / metadata.jsonl, splits by folder names,
    its checks on file names), streamed so that nothing is written to its cache; the audio column
    is read as the files' paths (decoding it is ours: datasets would need torchcodec)."""
    import datasets
    import pyarrow as pa

    try:
        found = datasets.load_dataset("audiofolder", data_dir=str(path), streaming=True)
    except Exception as exc:  # no audio files, a metadata file that does not parse: datasets says which
        raise InputError(f"cannot read {path} as an audiofolder ({str(exc).splitlines()[0]}); `specdec batch` "
                         "takes a folder of audio files (with metadata.csv for a dataset), a save_to_disk "
                         "folder or Parquet files") from None
    split, chosen = _one_split(path, dict(found), split)
    features = chosen.features
    names = [n for n, f in features.items() if isinstance(f, datasets.Audio)]
    paths = chosen
    for n in names:
        paths = paths.cast_column(n, datasets.Value("string"))
    try:
        rows = list(paths)  # the metadata and the paths: small, whatever the audio's size
    except Exception as exc:
        raise InputError(f"cannot read {path} as an audiofolder ({str(exc).splitlines()[0]})") from None
    for row in rows:
        for n in names:
            row[n] = {"bytes": None, "path": row[n]}
    schema = features.arrow_schema
    table = pa.Table.from_pylist(rows, schema=schema)
    column = _audio_column(path, schema, audio_column)

    def read(rows: int) -> Iterator[pa.Table]:
        for batch in table.to_batches(max_chunksize=rows):
            yield pa.Table.from_batches([batch], schema)

    return Corpus(path, "audiofolder", split, schema, column, table.num_rows, path, read)


def _audio_like(type_: Any) -> bool:
    """An Arrow type that can hold a clip: the Audio feature's struct (bytes, path), bytes, or a path."""
    import pyarrow as pa

    if pa.types.is_struct(type_):
        names = {type_.field(i).name for i in range(type_.num_fields)}
        return "bytes" in names or "path" in names or {"array", "sampling_rate"} <= names
    return pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_string(type_) \
        or pa.types.is_large_string(type_)


def audio_columns(schema: pa.Schema) -> list[str]:
    """The columns the Hugging Face features say are Audio; without features, the columns shaped
    as Audio stores itself (a struct of bytes and path)."""
    import pyarrow as pa

    if schema.metadata and b"huggingface" in schema.metadata:
        import datasets

        features = datasets.Features.from_arrow_schema(schema)
        return [name for name, feature in features.items() if isinstance(feature, datasets.Audio)]
    return [f.name for f in schema if pa.types.is_struct(f.type) and _audio_like(f.type)
            and f.type.get_field_index("bytes") >= 0]


def _audio_column(where: Path | str, schema: pa.Schema, given: str | None) -> str:
    names = schema.names
    if given is not None:
        if given not in names:
            raise InputError(f"{where} has no column {given!r} (its columns: {', '.join(names)}); give one of "
                             "them to --audio-column")
        if not _audio_like(schema.field(given).type):
            raise InputError(f"column {given!r} of {where} holds {schema.field(given).type}, not audio (bytes, a "
                             "path, or an Audio struct); give the audio column to --audio-column")
        return given
    found = audio_columns(schema)
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError(f"{where} has no Audio column (its columns: {', '.join(names)}); name the one holding "
                         "the audio with --audio-column")
    raise InputError(f"{where} has {len(found)} Audio columns ({', '.join(found)}); choose one with --audio-column")


# -- a row's audio ---------------------------------------------------------------------------------

def row_audio(pair: Pair, cell: Any, base: Path | None = None) -> tuple[str, Callable[[], np.ndarray]]:
    """A row's audio cell as (its name, how to read its samples): the Audio feature's dict with the
    file's bytes (decoded from them) or only its path (read from there, relative to `base`), bytes,
    a path, a decoded dict (array, sampling_rate) or a torchcodec decoder. The name (the cell's
    path, when it has one) is the record's `file`; a cell with no audio fails when read."""
    if isinstance(cell, Mapping):
        data, where = cell.get("bytes"), cell.get("path")
        if "array" in cell and cell.get("array") is not None:
            array, rate = cell["array"], cell.get("sampling_rate")
            return where or "<waveform>", lambda: pair.read(_numpy(array), int(rate) if rate else None,
                                                             too_long_hint=TOO_LONG_HINT)[1]
    elif isinstance(cell, (bytes, bytearray, memoryview)):
        data, where = bytes(cell), None
    elif isinstance(cell, (str, Path)):
        data, where = None, str(cell)
    elif hasattr(cell, "get_all_samples"):  # datasets' decoded Audio (torchcodec's AudioDecoder)
        def decoded() -> np.ndarray:
            samples = cell.get_all_samples()
            return pair.read(samples.data.numpy(), int(samples.sample_rate), too_long_hint=TOO_LONG_HINT)[1]
        return "<decoded audio>", decoded
    elif cell is None:
        data, where = None, None
    else:
        name = type(cell).__name__
        return f"<{name}>", _failing(InputError(f"the audio column holds a {name}, not audio (bytes, a path, or "
                                                "an Audio value)"))
    if data:
        name = where or "<audio bytes>"
        return name, lambda: pair.read(name, data=bytes(data), too_long_hint=TOO_LONG_HINT)[1]
    if where:
        file = Path(where)
        if not file.is_absolute() and base is not None and not file.exists():
            file = base / file
        return where, lambda: pair.read(file, too_long_hint=TOO_LONG_HINT)[1]
    return "<no audio>", _failing(InputError("this row has no audio (its audio cell is empty: no bytes, no path)"))


def _numpy(array: Any) -> np.ndarray:
    import numpy as np

    return np.asarray(array)


def _failing(exc: Exception) -> Callable[[], np.ndarray]:
    def read() -> np.ndarray:
        raise exc
    return read


def describe_cells(pair: Pair, resolved: Settings, cells: list[Any], batch_size: int = 8,
                   base: Path | None = None) -> list[dict[str, Any]]:
    """The records of a batch of audio cells, in their order (each described as `row_audio`
    reads it, `batch_size` decoded together; a row that fails gets its error record)."""
    records: list[dict[str, Any] | None] = [None] * len(cells)
    rows = ((i, *row_audio(pair, cell, base)) for i, cell in enumerate(cells))
    for i, result in pair.describe_rows(rows, resolved, batch_size):
        records[i] = result.record  # type: ignore[index]
    return records  # type: ignore[return-value]


# -- the record's fields as columns ---------------------------------------------------------------

class RecordColumns:
    """The record's fields as Arrow columns, one schema for the whole run: names and types from
    `records.template_records` (see the module doc), each name after `prefix`. A field no template
    gives a value (None in both) is a string column; a value that is not a string is then stored as
    its JSON text rather than lost."""

    def __init__(self, templates: list[dict[str, Any]], prefix: str = "") -> None:
        import pyarrow as pa

        self.prefix = prefix
        self.fields: list[str] = list(dict.fromkeys(name for t in templates for name in t))
        types = []
        for name in self.fields:
            values = [json_safe(t[name]) for t in templates if t.get(name) is not None]
            types.append(pa.array(values).type if values else pa.string())
        self.schema = pa.schema([pa.field(prefix + n, t) for n, t in zip(self.fields, types, strict=True)])

    @classmethod
    def of(cls, pair: Pair, resolved: Settings, prefix: str = "") -> RecordColumns:
        from .records import template_records

        return cls(template_records(pair.models, resolved), prefix)

    @property
    def names(self) -> list[str]:
        return self.schema.names

    def arrays(self, records: list[dict[str, Any]]) -> list[pa.Array]:
        """The records' fields as arrays of this schema, one per column, a missing field null."""
        import pyarrow as pa

        safe = [json_safe(r) for r in records]
        arrays = []
        for name, field in zip(self.fields, self.schema, strict=True):
            values = [r.get(name) for r in safe]
            if pa.types.is_string(field.type):
                values = [v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values]
            try:
                arrays.append(pa.array(values, type=field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
                raise SpecdecError(f"the records' field {name!r} holds a value its column cannot ({field.type}, "
                                   f"from the run's first record): {str(exc).splitlines()[0]}") from None
        return arrays

    def check_clash(self, input_names: Iterable[str], where: str) -> None:
        clash = [n for n in self.names if n in set(input_names)]
        if clash:
            raise InputError(f"{where} already has column{'s' if len(clash) > 1 else ''} {', '.join(clash[:4])}"
                             f"{', …' if len(clash) > 4 else ''}, which the records would add; give a prefix for "
                             "theirs (--column-prefix specdec_, or prefix= in Python)")


def output_schema(input_schema: pa.Schema, columns: RecordColumns, stamp: dict[str, Any] | None = None,
                  audio_column: str | None = None) -> pa.Schema:
    """The input's columns, then the record's, with Hugging Face features for both in the metadata
    (so `datasets` reads the audio column back as Audio, also where the input's metadata was lost on
    the way, as Ray Data's blocks may lose it) and, from a `specdec batch` run, its stamp."""
    import datasets
    import pyarrow as pa

    features = datasets.Features.from_arrow_schema(input_schema)
    if audio_column is not None and not isinstance(features.get(audio_column), datasets.Audio) \
            and audio_column in audio_columns(input_schema.remove_metadata()):
        features[audio_column] = datasets.Audio()
    features.update(datasets.Features.from_arrow_schema(columns.schema))
    metadata = dict(input_schema.metadata or {})
    metadata[b"huggingface"] = json.dumps({"info": {"features": features.to_dict()}}).encode()
    if stamp is not None:
        metadata[STAMP_KEY] = dumps_record(stamp).encode()
    return pa.schema([*input_schema, *columns.schema], metadata=metadata)


def with_records(table: pa.Table, records: list[dict[str, Any]], columns: RecordColumns,
                 schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    return pa.Table.from_arrays([*table.columns, *columns.arrays(records)], schema=schema)


# -- Dataset.map and Ray Data: one callable --------------------------------------------------------

# The pairs this process has loaded, by what names them: a Captioner pickled to many processes
# (Dataset.map's num_proc, Ray's actors) loads once in each, however many batches it is given.
_LOADED: dict[tuple, tuple[Pair, Settings, RecordColumns]] = {}


class Captioner:
    """Describe a dataset's audio column a batch at a time: `Dataset.map(captioner, batched=True)`
    or Ray Data's `map_batches`. Given an Arrow table (`ds.with_format("arrow")`, or
    `batch_format="pyarrow"`), it returns the table with the record's fields added as columns (typed
    alike in every batch; `columns` lists them); given a dict of lists, it returns the new columns as
    lists. The audio is decoded from the rows' bytes, `batch_size` clips decoded together.

    It pickles without the models: the pair is loaded once in each process, at its first batch
    (`load()` does it at once), so `num_proc` works. `edge`, `cloud`, `device`, `dtype`, `presets`,
    `preset` and `**settings` are `Pair`'s and `Pair.describe`'s; `audio_column`: the column holding
    the audio (default: the one Audio column, else "audio"); `prefix`: put before each record column's
    name (for a dataset that already has a `description`); `threads`: torch threads in each process
    (with num_proc on a small machine, 1); `base`: where a relative audio path is looked for."""

    def __init__(self, edge: str | None = None, cloud: str | None = None, *, device: str = "cpu",
                 dtype: str = "float32", presets: str | Path | None = None, preset: str = "fluent",
                 batch_size: int = 8, audio_column: str | None = None, prefix: str = "",
                 threads: int | None = None, base: str | Path | None = None, **settings: Any) -> None:
        from .settings import PairSpec

        self.spec: PairSpec = PairSpec.of(edge, cloud, device, dtype, presets).portable()
        self.preset, self.settings = preset, dict(sorted(settings.items()))
        self.batch_size, self.audio_column, self.prefix = batch_size, audio_column, prefix
        self.threads = threads
        self.base = Path(base).resolve() if base is not None else None

    def _key(self) -> tuple:
        return (self.spec, self.preset, repr(self.settings), self.prefix, self.threads)

    def load(self) -> tuple[Pair, Settings, RecordColumns]:
        """This process's pair, the resolved settings and the record columns (loaded at the first call)."""
        key = self._key()
        if key not in _LOADED:
            from .models import pin_threads
            from .pair import Pair

            if self.threads is not None:
                pin_threads(self.threads)
            pair = Pair.from_spec(self.spec)
            pair._api = True  # messages in the Python API's terms
            resolved = pair.resolve(self.preset, **self.settings)
            _LOADED[key] = (pair, resolved, RecordColumns.of(pair, resolved, self.prefix))
        return _LOADED[key]

    @property
    def columns(self) -> list[str]:
        """The names of the columns each batch gets (loads the pair)."""
        return self.load()[2].names

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        pair, resolved, columns = self.load()
        if isinstance(batch, pa.Table):
            found = audio_columns(batch.schema)
            column = self.audio_column or (found[0] if len(found) == 1 else "audio" if "audio" in batch.schema.names
                                           else _audio_column("the batch", batch.schema, None))
            columns.check_clash(batch.schema.names, "the dataset")
            records = describe_cells(pair, resolved, batch.column(column).to_pylist(), self.batch_size, self.base)
            schema = output_schema(batch.schema, columns, audio_column=column)
            return with_records(batch, records, columns, schema)
        if isinstance(batch, Mapping):
            column = self.audio_column or "audio"
            if column not in batch:
                raise InputError(f"the batch has no column {column!r} (its columns: {', '.join(batch)}); give the "
                                 "audio column as audio_column=")
            columns.check_clash(batch.keys(), "the dataset")
            records = describe_cells(pair, resolved, list(batch[column]), self.batch_size, self.base)
            table = pa.Table.from_arrays(columns.arrays(records), schema=columns.schema)
            return {name: table.column(name).to_pylist() for name in columns.names}
        raise TypeError(f"a Captioner takes a batch as an Arrow table or a dict of lists, not a {type(batch).__name__}")

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)  # no models: each process loads its own (see load)


def caption_with_ray(source: str | Path | list[str], destination: str | Path, captioner: Captioner, *,
                     workers: int | None = None, rows_per_batch: int = 64, address: str = "auto",
                     gpus_per_worker: float = 0.0, preserve_order: bool = True, overwrite: bool = False) -> None:
    """Describe a Parquet dataset past one machine with Ray Data: `read_parquet(source)` ->
    `map_batches` over a pool of `workers` actors, each holding `captioner` with its pair loaded
    once -> `write_parquet(destination)` (a folder of part files, the input columns and the
    record's). Ray Data streams the rows through (a bounded number of batches in flight, so memory
    stays flat), applies backpressure, and restarts a dead actor and reruns its batches.
    `address`: "auto" starts a Ray of its own on this machine (loopback only) for the call; an
    address joins a cluster; a process that already called `ray.init` keeps its Ray.
    `preserve_order`: the output's rows in the input's order (Ray Data's execution option);
    `overwrite`: replace `destination` (else one that exists is refused). A run does not resume:
    one that fails is run again whole."""
    from .scale.ray_batch import RayOptions
    from .scale.ray_data import map_parquet

    # Local paths made absolute here: Ray's workers run in the folder the Ray was started from, not
    # the caller's (a relative 'corpus.parquet' was not found once the caller had changed folder).
    sources = [_absolute(s) for s in source] if isinstance(source, list) else _absolute(source)
    map_parquet(RayOptions(address, workers, gpus_per_worker), sources, _absolute(destination), captioner,
                rows_per_batch, preserve_order, overwrite)


def _absolute(path: str | Path) -> str:
    """A local path as an absolute one; a URI (s3://, gs://...) as it is."""
    text = str(path)
    return text if "://" in text else str(Path(text).absolute())


# -- `specdec batch DATASET --out captions.parquet` ------------------------------------------------

@dataclass
class Caption:
    """One row finished in a `caption_corpus` run."""

    row: int
    record: dict[str, Any]


def caption_corpus(pair: Pair, resolved: Settings, corpus: Corpus, results: CorpusResults,
                   batch_size: int = 8) -> Iterator[Caption]:
    """Describe the rows `results` still lacks, `batch_size` in flight (continuous batching across
    the input's batches), appending each record to `results` as its row ends; yields each."""
    todo = results.todo()
    wanted = set(todo)

    def rows() -> Iterator[tuple[Hashable, str, Callable[[], np.ndarray]]]:
        start = 0
        for table in corpus.batches():
            indices = [i for i in range(start, start + table.num_rows) if i in wanted]
            if indices:
                cells = table.column(corpus.audio_column).take([i - start for i in indices]).to_pylist()
                for i, cell in zip(indices, cells, strict=True):
                    yield (i, *row_audio(pair, cell, corpus.base))
            start += table.num_rows
            if start > todo[-1]:
                return

    if not todo:
        return
    for row, result in pair.describe_rows(rows(), resolved, batch_size):
        results.append(int(row), result.record)  # type: ignore[arg-type]
        yield Caption(int(row), result.record)  # type: ignore[arg-type]


class CorpusResults:
    """The output of a `specdec batch` over a dataset, opened by its one writer: the journal it
    resumes from and the Parquet file (or folder of part files) it renders; see the module doc."""

    def __init__(self, out: Path, corpus: Corpus, settings: RunSettings, overwrite: bool = False,
                 prefix: str = "", retry_fallback: bool = False, folder: bool | None = None) -> None:
        """`folder`: write part files into `out` (default: when `out` is a folder already)."""
        self.out, self.corpus, self.prefix = out, corpus, prefix
        self.folder = output_kind(out) == "folder" if folder is None else folder
        self.journal = out / JOURNAL_IN_FOLDER if self.folder else out.with_name(f".{out.name}.specdec.jsonl")
        self.stamp: dict[str, Any] = {"settings": settings.as_record(), "input": corpus.identity(),
                                      "prefix": prefix}
        self.backup: Path | None = None
        self.lines: dict[int, str] = {}   # row -> its latest journal line (a record, ok or failed)
        self.kept = 0                      # rows recorded without error when the run began
        self.finished = False              # the output holds every row, without error: nothing to do
        self._file: Any = None
        self._lock = WriterLock(out)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except LockHeld as held:
            pid = f"pid {held.pid}" if held.pid is not None else "pid unknown"
            raise InputError(f"{out} is being written by another specdec batch ({pid}); wait for it to finish, "
                             "or give this run another --out") from None
        except OSError as exc:
            raise InputError(f"cannot write {out}: {exc.strerror or exc}") from exc
        try:
            self._open(overwrite, retry_fallback)
        except BaseException:
            self.close()
            raise

    # -- opening ----------------------------------------------------------------------------------

    def _open(self, overwrite: bool, retry_fallback: bool) -> None:
        if overwrite:
            self._start_over()
            lines: dict[int, str] = {}
        else:
            self._check_output()
            lines = self._read_journal()
            if lines is None:
                lines = self._from_output()
                self.finished = self.out.exists()
        kept = {row: line for row, line in lines.items() if _ok(line, retry_fallback)}
        self.lines, self.kept = kept, len(kept)
        if self.finished and len(kept) == self.corpus.num_rows:
            return  # a finished output and nothing to retry: no journal, nothing to write
        self.finished = False
        try:
            if self.folder:
                self.out.mkdir(parents=True, exist_ok=True)
            _write_atomically(self.journal, [dumps_record({"specdec_corpus": self.stamp}), *kept.values()])
            self._file = open(self.journal, "a", encoding="utf-8")  # closed in close()
        except OSError as exc:
            raise InputError(f"cannot write {self.journal}: {exc.strerror or exc}") from exc

    def _start_over(self) -> None:
        """--overwrite: the old output (and its journal) kept under OUT.bak, then an empty start."""
        out = self.out
        if self.folder and out.is_dir() and any(out.iterdir()):
            backup = backup_path(out)
            os.rename(out, backup)  # atomic: the old folder whole, journal and all
            self.backup = backup
        elif not self.folder and out.is_file() and out.stat().st_size > 0:
            self.backup = _keep_backup(out)
            out.unlink()
            if self.journal.exists():
                os.replace(self.journal, self.backup.with_name(f".{self.backup.name}.specdec.jsonl"))
            _fsync_dir(out.parent)
        elif self.journal.exists():
            self.journal.unlink()

    def _check_output(self) -> None:
        """Refuse an output that is not ours, or ours from other settings or another input."""
        import pyarrow.parquet as pq

        out = self.out
        if not out.exists():
            return
        if self.folder:
            if not out.is_dir():
                raise InputError(f"{out} is a file; give a folder or a NAME.parquet to --out")
            foreign = sorted(p.name for p in out.iterdir() if not p.name.startswith(".") and not _part(p.name))
            if foreign:
                more = ", …" if len(foreign) > 3 else ""
                raise refusal(out, f"holds files specdec did not write ({', '.join(foreign[:3])}{more})")
            files = sorted(p for p in out.iterdir() if _part(p.name))
        else:
            if out.is_dir():
                raise InputError(f"{out} is a folder; name a .parquet file to --out, or give the folder as {out}/")
            files = [out]
        for file in files:
            try:
                metadata = pq.read_schema(file).metadata or {}
            except Exception as exc:  # pyarrow's error for a file that is not Parquet
                raise refusal(file, f"is not a Parquet file ({str(exc).splitlines()[0]})") from None
            if STAMP_KEY not in metadata:
                raise refusal(file, "is a Parquet file specdec did not write (its metadata has no specdec stamp)")
            self._check_stamp(file, json.loads(metadata[STAMP_KEY]))

    def _check_stamp(self, where: Path, recorded: Any) -> None:
        if not isinstance(recorded, dict) or not isinstance(recorded.get("settings"), dict):
            raise refusal(where, "carries a specdec stamp this version cannot read")
        if recorded["settings"] != self.stamp["settings"]:
            raise refusal(where, f"was made with other settings ({differences(recorded['settings'], self.stamp['settings'])})")
        if recorded.get("input") != self.stamp["input"]:
            raise refusal(where, f"was made from another input ({_input_words(recorded.get('input'))}; this run "
                                 f"reads {_input_words(self.stamp['input'])})")
        if recorded.get("prefix", "") != self.prefix:
            raise refusal(where, f"has its record columns named with prefix {recorded.get('prefix', '')!r}, not "
                                 f"{self.prefix!r}")

    def _read_journal(self) -> dict[int, str] | None:
        """The journal's rows (the latest line of each), or None when there is none. A last line cut
        short by a kill is dropped; anything else that is not ours refuses the run."""
        try:
            raw = self.journal.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"cannot read {self.journal}: {exc.strerror or exc}") from exc
        *complete, tail = raw.split(b"\n")
        if not complete:
            return None  # killed before its header was whole
        try:
            header = json.loads(complete[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or "specdec_corpus" not in header:
            raise refusal(self.journal, "line 1 is not the header of a specdec journal")
        self._check_stamp(self.journal, header["specdec_corpus"])
        lines: dict[int, str] = {}
        rows = self.corpus.num_rows
        for number, line in enumerate(complete[1:], start=2):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                raise refusal(self.journal, f"line {number} is not JSON") from None
            if not (isinstance(value, dict) and isinstance(value.get("row"), int) and 0 <= value["row"] < rows
                    and isinstance(value.get("record"), dict)):
                raise refusal(self.journal, f"line {number} is not a row's record")
            lines[value["row"]] = line.decode("utf-8")
        if tail.strip() and not (tail.startswith(JOURNAL_ROW_START) or JOURNAL_ROW_START.startswith(tail)):
            raise refusal(self.journal, "ends with a line that is not a row's record")
        return lines

    def _from_output(self) -> dict[int, str]:
        """The rows of a finished output (its journal removed): read back from its record columns."""
        import pyarrow.parquet as pq

        files = sorted(p for p in self.out.iterdir() if _part(p.name)) if self.folder and self.out.is_dir() \
            else [self.out] if self.out.is_file() else []
        lines: dict[int, str] = {}
        row = 0
        for file in files:
            stamp = json.loads(pq.read_schema(file).metadata[STAMP_KEY])
            fields = stamp.get("fields", [])
            table = pq.read_table(file, columns=[self.prefix + f for f in fields])
            columns = [table.column(self.prefix + f).to_pylist() for f in fields]
            for values in zip(*columns, strict=True):
                record = {f: v for f, v in zip(fields, values, strict=True)}
                lines[row] = dumps_record({"row": row, "record": record})
                row += 1
        return lines

    # -- the run ----------------------------------------------------------------------------------

    def todo(self) -> list[int]:
        """The rows without a record (every row not recorded, or recorded with an error)."""
        return [i for i in range(self.corpus.num_rows) if i not in self.lines]

    def append(self, row: int, record: dict[str, Any]) -> None:
        """Journal one row's record: on disk before the next row starts (a kill loses no finished row)."""
        assert self._file is not None, "the journal is closed"
        line = dumps_record({"row": row, "record": record})
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.lines[row] = line

    def write(self, columns: RecordColumns) -> None:
        """Render the output from the input and the journal (every row must have its record), each
        file written to a temporary name, fsync'd and renamed; then drop the journal."""
        import pyarrow.parquet as pq

        missing = self.corpus.num_rows - len(self.lines)
        if missing:
            raise SpecdecError(f"{missing} rows have no record yet; rerun to describe them")
        columns.check_clash(self.corpus.schema.names, str(self.corpus.path))
        stamp = dict(self.stamp, fields=columns.fields)
        schema = output_schema(self.corpus.schema, columns, stamp, self.corpus.audio_column)
        written: list[Path] = []
        writer, tmp, part, in_part = None, None, 0, 0

        def close() -> None:
            nonlocal writer
            if writer is not None:
                writer.close()
                _fsync_file(tmp)
                target = self.out / _part_name(part) if self.folder else self.out
                os.replace(tmp, target)
                written.append(target)
                writer = None

        start = 0
        try:
            for table in self.corpus.batches():
                records = [json.loads(self.lines[i])["record"] for i in range(start, start + table.num_rows)]
                full = with_records(table, records, columns, schema)
                offset = 0
                while offset < full.num_rows:
                    if writer is None:
                        target = self.out / _part_name(part) if self.folder else self.out
                        tmp = target.with_name(f".{target.name}.tmp")
                        writer = pq.ParquetWriter(tmp, schema, use_dictionary=_dictionary_columns(schema))
                        in_part = 0
                    take = full.num_rows - offset if not self.folder else min(full.num_rows - offset,
                                                                             ROWS_PER_PART - in_part)
                    writer.write_table(full.slice(offset, take))
                    offset, in_part = offset + take, in_part + take
                    if self.folder and in_part >= ROWS_PER_PART:
                        close()
                        part += 1
                start += table.num_rows
            if writer is None and not written:  # an input with no rows: an empty file of the same columns
                target = self.out / _part_name(0) if self.folder else self.out
                tmp = target.with_name(f".{target.name}.tmp")
                writer = pq.ParquetWriter(tmp, schema, use_dictionary=_dictionary_columns(schema))
            close()
        finally:
            if writer is not None:  # stopped part-way: the temporary file goes, the journal stays
                writer.close()
                tmp.unlink(missing_ok=True)
        if self.folder:
            for stale in self.out.iterdir():
                if _part(stale.name) and stale not in written:
                    stale.unlink()
        _fsync_dir(self.out if self.folder else self.out.parent)
        self.journal.unlink()
        _fsync_dir(self.journal.parent)
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._lock.release()

    def __enter__(self) -> CorpusResults:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _ok(line: str, retry_fallback: bool) -> bool:
    record = json.loads(line)["record"]
    return record.get("error") is None and not (retry_fallback and record.get("fallback") is not None)


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth dictionary-encoding: all but those holding bytes (the audio). Trying it on
    a column of distinct clips only costs: pyarrow hashes each one until the dictionary outgrows its
    page and then falls back to plain (measured: 6x the CPU time of the whole write)."""
    import pyarrow as pa

    def has_bytes(type_: pa.DataType) -> bool:
        if pa.types.is_struct(type_):
            return any(has_bytes(type_.field(i).type) for i in range(type_.num_fields))
        return pa.types.is_binary(type_) or pa.types.is_large_binary(type_)

    return [f.name for f in schema if not has_bytes(f.type)]


def _part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def _part(name: str) -> bool:
    return name.startswith("part-") and name.endswith(".parquet")


def _fsync_file(path: Path | None) -> None:
    if path is None:
        return
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _input_words(identity: Any) -> str:
    if not isinstance(identity, dict):
        return "an unknown input"
    split = f", split {identity.get('split')}" if identity.get("split") else ""
    return f"{identity.get('input')}{split}, {identity.get('rows')} rows, audio in {identity.get('audio_column')!r}"
