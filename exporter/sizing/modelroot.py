"""What a target's model ``root`` may make the exporter read: nothing outside what was allowed.

vLLM's ``/v1/models`` reports a ``root``: the ``--model`` it was started with, a hub id or a
path on vLLM's machine. A path is on the *exporter's* machine too only where they share a volume,
and a target is not trusted to name files there: a ``root`` of ``/dev/zero`` or of a 512 MB GGUF
file would be read, and the answer would tell any target which paths exist. So a path is opened
only inside a directory of the ``model_roots`` setting (symbolic links resolved, then checked
again), and then only its small JSON files, each bounded (:mod:`exporter.sizing.modelconfig`).
A hub id is looked up in the local Hugging Face cache the operator configured, never as a path;
anything else (a relative path, a bare name) only by name in the built-in catalogue.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

#: ``org/name`` as the Hugging Face hub spells a repository id (no ``..``, no leading dot).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


class RootKind(StrEnum):
    """How a target's ``root`` is looked up."""

    #: ``org/name``: the local Hugging Face cache, then the catalogue.
    HUB_ID = "hub_id"
    #: An absolute path inside ``model_roots``: its config.json, bounded.
    ALLOWED_PATH = "allowed_path"
    #: Anything else: the catalogue by name only; nothing local is opened.
    NAME_ONLY = "name_only"


def is_hub_id(root: str) -> bool:
    """Whether ``root`` is spelt as a hub repository id (``org/name``)."""
    return _HUB_ID.fullmatch(root) is not None and ".." not in root


def within(path: Path | str, allowed: Sequence[Path]) -> Path | None:
    """``path`` with every symbolic link resolved, if that is inside one of ``allowed``.

    The allowed directories are resolved too. Nothing is opened: only names are resolved.
    """
    real = Path(os.path.realpath(path))
    for base in allowed:
        base_real = Path(os.path.realpath(base))
        if real == base_real or base_real in real.parents:
            return real
    return None


def classify_root(root: str, allowed: Sequence[Path]) -> RootKind:
    """How a target's ``root`` may be used, given the ``model_roots`` setting."""
    if is_hub_id(root):
        return RootKind.HUB_ID
    # ``..`` is refused before any link is resolved: through a link it would lead elsewhere
    # than it reads, and whether it lands inside would tell what the link is.
    if os.path.isabs(root) and ".." not in Path(root).parts and within(root, allowed) is not None:
        return RootKind.ALLOWED_PATH
    return RootKind.NAME_ONLY
