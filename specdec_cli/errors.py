"""Domain errors. Each carries a one-line message (what is wrong and what to do) and an exit code:
2 for bad input or usage, 1 for runtime failures. The CLI maps them in one place.

A message may quote text specdec does not control (a server's error, a file name, a library's
exception): every message is made printable on one line here, where errors become text, so a
newline cannot split the line and an escape sequence (clear screen, set the terminal's title)
cannot reach the user's terminal."""

from __future__ import annotations

import unicodedata

# Control characters (C0, DEL, C1), format characters (bidi overrides, zero-width marks), line and
# paragraph separators, lone surrogates: written as Python escapes (\n, \x1b, \u202e) instead.
_ESCAPED = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))


def printable(text: str) -> str:
    """`text` on one line with every control character escaped; other text (CJK included) as is."""
    if text.isprintable():
        return text
    return "".join(c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   if unicodedata.category(c) in _ESCAPED else c for c in text)


class SpecdecError(Exception):
    exit_code = 1

    def __init__(self, message: str) -> None:
        message = printable(message)
        super().__init__(message)
        self.message = message


class InputError(SpecdecError):
    """Bad input from the user: a missing or unreadable file, an unusable clip, a bad option."""

    exit_code = 2


class TooLong(InputError):
    """A clip over the model's window: describable in segments (--segment), never as it is."""


class ModelError(SpecdecError):
    """A model or processor that cannot be loaded, or a pair that does not fit together."""

    exit_code = 1


def one_line(exc: BaseException) -> str:
    """What to record or print for a failure: a domain error's message; for anything else its type
    and the first line of its text (batch lines and eval records both use this), printable."""
    if isinstance(exc, SpecdecError):
        return exc.message
    text = str(exc).strip().splitlines()
    return printable(f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__)


# What kind of failure a failed clip's record holds (its `error_kind`): "input" (the file cannot be
# described as it is: not audio, silent, too short, damaged), "too_long" (over the model's window:
# describe it in segments), "failed" (anything else: a cloud, memory, a worker; a rerun may succeed).
RETRYABLE = "failed"


def error_kind(exc: BaseException | None) -> str:
    """The `error_kind` of a clip that failed with `exc`: only "failed" is worth a rerun as it is."""
    if isinstance(exc, TooLong):
        return "too_long"
    if isinstance(exc, InputError):
        return "input"
    return RETRYABLE
