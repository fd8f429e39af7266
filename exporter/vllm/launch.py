"""What a vLLM server was started with: the scheduler flags read from its command line.

No metric, endpoint or INFO log line of vLLM says ``max_num_seqs`` (docs/sizing.md), but the
flags a user gave are on the server's command line, which the sidecar already reads from
``/proc`` to find vLLM's GPUs. This module reads them the way vLLM's argparse does: ``--flag N``
and ``--flag=N``, underscores or dashes, the last occurrence winning, and the human-readable
integers (``8k``, ``16K``) vLLM accepts for token counts. A ``--config`` YAML file's keys become
flags the way vLLM's ``FlexibleArgumentParser.load_config_file`` makes them (vLLM 0.32), placed
before the command line's own so that the command line wins, as in vLLM.

Pure: argv (and the config file's parsed document) in, plain data out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

#: vLLM's default ``--port``.
DEFAULT_PORT = 8000

_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

# Flag spellings (after underscores become dashes) -> field.
_INT_FLAGS = {
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-num-active-seqs": "max_num_active_seqs",
    "--tensor-parallel-size": "tensor_parallel",
    "-tp": "tensor_parallel",
    "--pipeline-parallel-size": "pipeline_parallel",
    "-pp": "pipeline_parallel",
    "--port": "port",
    "--max-num-queued-reqs": "max_num_queued_reqs",
    "--max-num-queued-tokens": "max_num_queued_tokens",
}
#: Flags for which vLLM accepts 0 (``Field(ge=0)``: an admission cap of 0 refuses everything).
_ZERO_ALLOWED = frozenset({"--max-num-queued-reqs", "--max-num-queued-tokens"})
_TEXT_FLAGS = {"--performance-mode": "performance_mode", "--config": "config_file"}


@dataclass(frozen=True, slots=True)
class LaunchFlags:
    """The scheduler-relevant flags of one vLLM server (``None``: not on its command line)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_active_seqs: int | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    performance_mode: str | None = None
    port: int | None = None
    #: The API server's admission caps (0.32+): unfinished requests, and prompt tokens in
    #: prefill, past which vLLM answers 503.
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    #: ``--config FILE``: flags may be set there too.
    config_file: str | None = None
    #: Why the config file's values are not included (unreadable, not a mapping); None when
    #: they are, or when there is no config file.
    config_problem: str | None = None
    #: Flags given a value vLLM would refuse (``--max-num-seqs abc``): name -> text.
    invalid: tuple[tuple[str, str], ...] = ()

    @property
    def listen_port(self) -> int:
        """The port the API server listens on."""
        return self.port if self.port is not None else DEFAULT_PORT


def human_readable_int(text: str) -> int | None:
    """``"8192"``, ``"8k"`` (8,000) or ``"8K"`` (8,192) as vLLM reads them; None otherwise."""
    value = text.strip()
    if value.isascii() and value.isdigit():
        return int(value)
    match = _HUMAN.fullmatch(value)
    if match is None:
        return None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        return None  # vLLM refuses fractions of binary units
    return int(number) * _BINARY[suffix]


def _split(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """``(flag, value)`` pairs; a flag's value is the next word unless given with ``=``."""
    pairs: list[tuple[str, str | None]] = []
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("-") or word == "-":
            continue
        name, sep, value = word.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        known = name in _INT_FLAGS or name in _TEXT_FLAGS
        if not sep and known and index < len(words):
            value = words[index]
            index += 1
            pairs.append((name, value))
        elif known:
            pairs.append((name, value if sep else None))
    return pairs


def config_arguments(document: object) -> list[str] | None:
    """A ``--config`` YAML document as the flags vLLM makes of it; None when not a mapping.

    As vLLM: ``key: value`` becomes ``--key value``, ``key: true`` becomes ``--key``, a list
    becomes ``--key item...``, a nested mapping one JSON word; ``false`` and empty lists add
    nothing here (vLLM may add ``--no-key``, which sets none of our flags).
    """
    if not isinstance(document, dict):
        return None
    words: list[str] = []
    for key, value in document.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            words += [flag] if value else []
        elif isinstance(value, list):
            words += [flag, *(str(item) for item in value)] if value else []
        elif isinstance(value, dict):
            words += [flag, json.dumps(value)]
        else:
            words += [flag, str(value)]
    return words


def parse_launch_flags(
    argv: Sequence[str], *, config: Sequence[str] = (), config_problem: str | None = None
) -> LaunchFlags:
    """The scheduler flags of a vLLM command line (``vllm serve ...`` or ``python -m ...``).

    ``config``: the ``--config`` file's flags (:func:`config_arguments`), which the command
    line overrides; ``config_problem``: why they could not be read, kept for the caller.
    """
    found: dict[str, object] = {}
    invalid: dict[str, str] = {}
    for name, value in _split([*config, *argv]):
        if value is None:
            invalid[name] = ""
            continue
        if name in _TEXT_FLAGS:
            found[_TEXT_FLAGS[name]] = value
            continue
        number = human_readable_int(value)
        if number is None or number < (0 if name in _ZERO_ALLOWED else 1):
            invalid[name] = value
            found.pop(_INT_FLAGS[name], None)
            continue
        invalid.pop(name, None)
        found[_INT_FLAGS[name]] = number
    return LaunchFlags(
        **found,  # type: ignore[arg-type]
        config_problem=config_problem,
        invalid=tuple(sorted(invalid.items())),
    )
