"""Finding a model by what a user or vLLM calls it: one lookup, in one order, for every command.

A model directory or ``config.json`` path first, then a hub id in the local Hugging Face cache
(nothing is downloaded), then the built-in catalogue by name, hub id or alias. ``plan`` and the
sidecar's predictor both call :func:`find_model_arch`; what was not found anywhere is a
:class:`~exporter.errors.ModelNotFoundError`, which callers tell apart by type, never by text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.errors import ModelConfigError, ModelNotFoundError, UnsupportedModelError
from exporter.sizing.catalog import find_model
from exporter.sizing.modelconfig import (
    model_weights_bytes,
    read_model_config,
    resolve_config_path,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from exporter.sizing.model import ModelArch


@dataclass(frozen=True, slots=True)
class FoundModel:
    """A model's architecture, where it came from, and its checkpoint size when known."""

    arch: ModelArch
    #: ``"files"`` (a directory, a config.json or the HF cache) or ``"catalogue"``.
    origin: str
    #: Bytes of the safetensors checkpoint beside the config, if any.
    weights_bytes: int | None = None
    #: Why the checkpoint size could not be read (a corrupt index), if it could not.
    weights_error: str | None = None


def find_model_arch(
    source: str,
    *,
    hf_home: Path | None = None,
    also_known_as: Sequence[str | None] = (),
    catalogue_if_unusable: bool = False,
    local: bool = True,
    allowed: Sequence[Path] | None = None,
) -> FoundModel:
    """The model ``source`` names: files first, then the catalogue (``source`` or an alias).

    ``also_known_as`` are other names for the same model (vLLM's served model id), tried in the
    catalogue after ``source``. With ``catalogue_if_unusable``, a config that is there but
    cannot be read or parsed also falls back to the catalogue (a live target must not lose its
    prediction to a permission problem when its name is known); an unsupported architecture
    never does. ``local=False`` never takes ``source`` as a path (the hub cache and the
    catalogue only); ``allowed`` keeps every file read inside those directories (a path a
    target named, :mod:`exporter.sizing.modelroot`). Raises :class:`ModelNotFoundError`,
    :class:`UnsupportedModelError` or :class:`ModelConfigError`.
    """
    try:
        config = resolve_config_path(source, hf_home=hf_home, local=local)
        arch = read_model_config(config, name=source, allowed=allowed)
    except UnsupportedModelError:
        raise
    except ModelConfigError as exc:
        usable_elsewhere = isinstance(exc, ModelNotFoundError) or catalogue_if_unusable
        entry = _catalogue(source, also_known_as) if usable_elsewhere else None
        if entry is None:
            raise
        return entry
    try:
        weights = model_weights_bytes(config.parent, allowed=allowed)
    except ModelConfigError as exc:
        return FoundModel(arch, "files", None, str(exc))
    return FoundModel(arch, "files", weights)


def catalogue_model(names: Sequence[str | None]) -> FoundModel | None:
    """The first of ``names`` the built-in catalogue knows (no file is read), or None."""
    return _catalogue("", names)


def _catalogue(source: str, also_known_as: Sequence[str | None]) -> FoundModel | None:
    for name in (source, *also_known_as):
        entry = find_model(name) if name else None
        if entry is not None:
            return FoundModel(entry.arch(), "catalogue")
    return None
