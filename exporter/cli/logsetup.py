"""structlog configuration, done once at the entry point.

JSON lines when stderr is not a terminal (containers, log shippers), readable console output
on one. Modules log event names with key-value context (``log.warning("source_failed",
source="nvml", reason="gpu_lost")``) and never configure logging themselves.

Tracebacks never carry the frames' local variables (structlog's default for JSON shows them):
a frame that read vLLM's /proc entries or sent the bearer token would put a secret in the log.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import structlog
from structlog.tracebacks import ExceptionDictTransformer

if TYPE_CHECKING:
    from structlog.typing import Processor

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(*, level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog for the process: ``fmt`` is ``auto``, ``json`` or ``console``."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if use_console:
        processors.append(
            structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
        )
    else:
        no_locals = ExceptionDictTransformer(show_locals=False)
        processors += [
            structlog.processors.ExceptionRenderer(no_locals),
            structlog.processors.JSONRenderer(),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
