"""Built-in catalogues of GPUs and model architectures, so ``plan`` works offline by name.

The data lives in ``exporter/data/gpus.csv`` and ``exporter/data/models.json``, each fact with
its source. Lookups are forgiving about case, spaces, dashes and the ``org/`` prefix, and an
unknown name fails with the closest matches. Reading the packaged files is the only I/O here.
"""

from __future__ import annotations

import csv
import difflib
import json
import re
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from exporter.errors import ModelConfigError, UsageError
from exporter.sizing.model import ModelArch, require_sized, size_deployment
from exporter.sizing.modelconfig import parse_model_config
from exporter.sizing.overhead import GIB

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from exporter.sizing.model import Deployment


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model and the memory CUDA sees on it."""

    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    source: str


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One catalogue model: its names, parameter count, config fields and their source."""

    name: str
    hf_id: str | None
    aliases: tuple[str, ...]
    params: int
    source: str
    config: dict[str, Any]

    def arch(self) -> ModelArch:
        """The architecture, parsed like any config.json."""
        return parse_model_config(self.config, name=self.name, params=self.params)


def _key(name: str) -> str:
    """Normalise a name for lookup: lower case, no org prefix, no separators."""
    text = name.strip().lower()
    return re.sub(r"[\s_\-./]", "", text)


def _keys(name: str) -> set[str]:
    keys = {_key(name)}
    if "/" in name:
        keys.add(_key(name.split("/", 1)[1]))
    return keys


def _read(filename: str) -> str:
    return resources.files("exporter").joinpath("data", filename).read_text(encoding="utf-8")


@cache
def gpus() -> tuple[GpuSpec, ...]:
    """Every catalogue GPU, smallest memory first."""
    lines = [line for line in _read("gpus.csv").splitlines() if not line.startswith("#")]
    specs = [
        GpuSpec(
            name=row["name"],
            aliases=tuple(a for a in row["aliases"].split("|") if a),
            memory_bytes=int(float(row["cuda_memory_gib"]) * GIB),
            source=row["source"],
        )
        for row in csv.DictReader(lines)
    ]
    return tuple(sorted(specs, key=lambda spec: spec.memory_bytes))


@cache
def models() -> tuple[ModelEntry, ...]:
    """Every catalogue model, in file order."""
    data = json.loads(_read("models.json"))
    return tuple(
        ModelEntry(
            name=item["name"],
            hf_id=item.get("hf_id"),
            aliases=tuple(item.get("aliases", ())),
            params=round(float(item["params_b"]) * 1e9),
            source=item["source"],
            config=item["config"],
        )
        for item in data["models"]
    )


def _close_matches(name: str, candidates: Iterable[str]) -> str:
    names = sorted(set(candidates))
    found = difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=3, cutoff=0.5)
    by_lower = {n.lower(): n for n in names}
    if not found:
        found = [n.lower() for n in names if _key(name)[:4] in _key(n)][:3]
    return ", ".join(by_lower[f] for f in found)


def find_gpu(name: str) -> GpuSpec:
    """The catalogue GPU called ``name`` (or one of its aliases); UsageError with close matches."""
    wanted = _key(name)
    for spec in gpus():
        if wanted in {_key(spec.name), *map(_key, spec.aliases)}:
            return spec
    hint = _close_matches(name, [spec.name for spec in gpus()])
    known = hint or ", ".join(spec.name for spec in gpus())
    raise UsageError(f"unknown GPU {name!r}: did you mean {known}? (or give --gpu-mem-gib)")


def find_model(name: str) -> ModelEntry | None:
    """The catalogue model called ``name`` (name, hub id or alias), or None."""
    wanted = _keys(name)
    for entry in models():
        names = [entry.name, *entry.aliases] + ([entry.hf_id] if entry.hf_id else [])
        if any(wanted & _keys(candidate) for candidate in names):
            return entry
    return None


def unknown_model_error(name: str) -> ModelConfigError:
    """The error for a name that is neither a path, a cached hub id nor a catalogue model."""
    names = [entry.name for entry in models()]
    hint = _close_matches(name, names)
    suggestion = f"did you mean {hint}? " if hint else ""
    return ModelConfigError(
        f"unknown model {name!r}: {suggestion}Give a catalogue name (vllm-headroom plan "
        "--list-models), a model directory, a cached Hugging Face id, or --layers/--kv-heads/"
        "--head-dim/--params-b"
    )


def smallest_gpu(
    arch: ModelArch,
    *,
    deployment: Deployment,
    sequences: int,
    context_tokens: int,
    candidates: Sequence[GpuSpec] | None = None,
) -> GpuSpec | None:
    """The smallest catalogue GPU that holds ``sequences`` of ``context_tokens`` at once.

    Everything else of ``deployment`` (TP, utilization, dtypes) is kept; None if no GPU does.
    """
    for spec in candidates if candidates is not None else gpus():
        trial = replace(deployment, gpu_memory_bytes=spec.memory_bytes, gpu_name=spec.name.lower())
        result = require_sized(size_deployment(arch, deployment=trial))
        if result.sequences_at(context_tokens) >= sequences:
            return spec
    return None
