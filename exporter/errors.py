"""The exception hierarchy, drawn once.

Every error a user can cause (a bad flag, a missing model file, a malformed capture) is a
:class:`UsageError`: the CLI prints its message as one line and exits with code 2. Its message
names the problem and the fix. Anything else escaping to the CLI is a bug in vllm-headroom.
"""

from __future__ import annotations

#: Most characters of a refused value a message repeats (the rest is counted, not shown).
SHOWN_CHARS = 40


def quoted(text: str) -> str:
    """``text`` as a message may quote it: its ``repr``, cut at :data:`SHOWN_CHARS` characters.

    The ``repr`` keeps a newline or an escape sequence from breaking the line or the terminal.
    """
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r} (the first {SHOWN_CHARS} of {len(text):,} characters)"


class HeadroomError(Exception):
    """Base class for every error vllm-headroom raises on purpose."""


class UsageError(HeadroomError):
    """Bad input from the user: flags, settings, model files, captures. Exit code 2."""


class ModelConfigError(UsageError):
    """A model's ``config.json`` (or the catalogue entry) cannot be used for sizing."""


class ModelNotFoundError(ModelConfigError):
    """No model directory, ``config.json``, cached hub id or catalogue entry has that name."""


class UnsupportedModelError(ModelConfigError):
    """The model's attention kind is one the sizing model declines, with the reason."""


class ParseError(UsageError):
    """A Prometheus text exposition could not be parsed; the message names the line."""


class SourceError(HeadroomError):
    """A data source (vLLM HTTP, NVML) failed; carries a bounded ``reason`` for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        #: Low-cardinality reason, safe to use as a label value (``timeout``, ``http_5xx``...).
        self.reason = reason
