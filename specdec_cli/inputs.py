"""One policy for the commands that take many clips (describe with several, batch, eval, calibrate).

Every clip is checked before any model loads (audio.probe: it exists, is a readable, non-empty
regular file, and its header decodes); every problem is listed at once, one line per file; a bad
file is skipped with its reason and counted, never the end of the run; and a run where some clips
were skipped or failed ends with exit code 1 (`some_failed`), the same in every command, after the
output for the others. What the header cannot tell (a damaged body, silence, the real length) is
found when a clip is read; `read_all` skips those the same way.

The commands print; this module decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from .errors import SpecdecError, error_kind, one_line, printable

T = TypeVar("T")
A = TypeVar("A")

# Attributes a description is scored on (evaluate.ATTRIBUTES): one changed attribute on one clip
# moves a mean accuracy over n clips by 100 / (ATTRIBUTES * n) points.
ATTRIBUTES = 6


def clips(n: int, noun: str = "clip") -> str:
    """A count as a person says it: "1 clip", "2 clips", "1 calibration clip"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True)
class Skipped:
    """A file left out, and why (one line, printable: a file name cannot carry an escape sequence)."""

    path: Path
    reason: str
    kind: str = "input"  # errors.error_kind of why

    def line(self) -> str:
        name = printable(str(self.path))
        reason = printable(self.reason)
        return f"skipped: {reason}" if name in reason else f"skipped: {name}: {reason}"


@dataclass
class Checked(Generic[T]):
    """The clips that passed, in input order, and the files left out."""

    clips: list[T]
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.clips) + len(self.skipped)


def check_clips(items: Iterable[T], path_of: Callable[[T], Path] = Path) -> Checked[T]:  # type: ignore[assignment]
    """Each item whose file passes audio.probe, in order; the others with their reasons."""
    from .audio import probe

    checked: Checked[T] = Checked([])
    for item in items:
        path = path_of(item)
        try:
            probe(path)
        except SpecdecError as exc:
            checked.skipped.append(Skipped(path, exc.message, error_kind(exc)))
        else:
            checked.clips.append(item)
    return checked


def read_all(items: Sequence[T], read: Callable[[T], A], path_of: Callable[[T], Path],
             on_skip: Callable[[Skipped], None] | None = None) -> tuple[list[T], list[A], list[Skipped]]:
    """Read every item (`read`: its samples); the ones that read, their samples, and the ones that did
    not with the reason (a damaged body, silence, over the window: what only decoding finds)."""
    kept: list[T] = []
    audios: list[A] = []
    skipped: list[Skipped] = []
    for item in items:
        try:
            audio = read(item)
        except SpecdecError as exc:
            skip = Skipped(path_of(item), exc.message, error_kind(exc))
        except Exception as exc:  # a decoder's failure on a damaged file, whatever its type
            skip = Skipped(path_of(item), one_line(exc))
        else:
            kept.append(item)
            audios.append(audio)
            continue
        skipped.append(skip)
        if on_skip is not None:
            on_skip(skip)
    return kept, audios, skipped


def resolution_points(clips: int) -> float:
    """How far one changed attribute on one clip moves a mean accuracy over `clips` clips (points)."""
    return math.inf if clips <= 0 else 100.0 / (ATTRIBUTES * clips)


def clips_for_resolution(points: float) -> int:
    """The fewest clips for which one changed attribute on one clip moves the mean by at most `points`."""
    return math.ceil(100.0 / (ATTRIBUTES * points)) if points > 0 else math.inf  # type: ignore[return-value]


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 file', '2 files'."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def some_failed(failed: int, total: int, what: str = "clips", rest: str = "") -> SpecdecError:
    """The end of a run where some clips failed or were skipped: exit code 1 in every command, said
    the same way (the output for the others is already written)."""
    return SpecdecError(f"{failed} of {total} {what} failed (each said why above){rest}")
