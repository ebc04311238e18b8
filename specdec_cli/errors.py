"""Domain errors. Each carries a one-line message (what is wrong and what to do) and an exit code:
2 for bad input or usage, 1 for runtime failures. The CLI maps them in one place."""

from __future__ import annotations


class SpecdecError(Exception):
    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InputError(SpecdecError):
    """Bad input from the user: a missing or unreadable file, an unusable clip, a bad option."""

    exit_code = 2


class ModelError(SpecdecError):
    """A model or processor that cannot be loaded, or a pair that does not fit together."""

    exit_code = 1


def one_line(exc: BaseException) -> str:
    """What to record or print for a failure: a domain error's message; for anything else its type
    and the first line of its text (batch lines and eval records both use this)."""
    if isinstance(exc, SpecdecError):
        return exc.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
