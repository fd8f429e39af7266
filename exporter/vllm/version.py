"""vLLM version numbers: parsing, ordering, and a guess from what a payload exposes.

vLLM's behaviour that the sizing model depends on (default utilization, how the memory profiler
counts CUDA graphs, how the capacity line is computed) changes between releases, so the model
takes the version as an input. Versions arrive as text from ``/version``, from the CLI and from
the calibration data (``"0.19.0"``, ``"v0.10.1rc2"``, ``"0.11.0 (V1)"``, ``"0.6.4.post1"``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.errors import UsageError
from exporter.vllm import families

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.core.snapshot import VllmSnapshot

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, slots=True, order=True)
class VllmVersion:
    """A vLLM release as ``major.minor.patch``; pre-release and build tags are ignored."""

    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    def at_least(self, major: int, minor: int, patch: int = 0) -> bool:
        """Whether this version is ``major.minor.patch`` or later."""
        return self >= VllmVersion(major, minor, patch)


#: The newest release whose behaviour the model knows; the default when none is given.
LATEST_KNOWN = VllmVersion(0, 33, 0)


def parse_vllm_version(text: str) -> VllmVersion:
    """Parse ``"0.19.0"``, ``"v0.10.1rc2"`` or ``"0.11.0 (V1)"``; raise :class:`UsageError`."""
    match = _VERSION.match(text)
    if match is None:
        raise UsageError(
            f"cannot read vLLM version {text!r}: give MAJOR.MINOR[.PATCH], for example 0.19.0"
        )
    major, minor, patch = match.groups()
    return VllmVersion(int(major), int(minor), int(patch or 0))


# --- version guess -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Clue:
    """A fact that bounds the vLLM version.

    ``low`` is the first release with it; ``high`` the last one, either a release series
    (``(0, 11)``: some 0.11.x) or an exact release (``(0, 6, 2)``).
    """

    low: tuple[int, ...] | None = None
    high: tuple[int, ...] | None = None


# Presence of a family (as a 0.0.4 TYPE line names it): the table's rows whose first release or
# last series is firm (exporter.vllm.families: DESIGN section 4, dated vLLM PRs and the capture
# headers in tests/fixtures/vllm-metrics/; the 0.32.0 capture already has
# admission_rejections_total, which DESIGN dates to 0.33: the capture wins).
_FAMILY_CLUES: Final[Mapping[str, _Clue]] = {
    row.type_name: _Clue(low=row.since, high=row.last_series)
    for row in families.FAMILIES
    if row.dates_version
}
# Presence of a cache_config_info label: the label set is every CacheConfig field of that vLLM.
_LABEL_CLUES: Final[Mapping[str, _Clue]] = {
    "kv_cache_size_tokens": _Clue(low=(0, 24)),  # "from about 0.24" (DESIGN)
    "cpu_kvcache_space_bytes": _Clue(low=(0, 9, 2)),
    "is_attention_free": _Clue(low=(0, 6, 3)),
}
_ENGINE_LABEL_CLUE: Final = _Clue(low=(0, 8, 3))
# Only the old usage name: a V0 engine (<= 0.10) or V1 before the rename in 0.9.2.
_OLD_USAGE_ONLY_CLUE: Final = _Clue(high=(0, 10))
_USAGE_NAMES: Final = [row.type_name for row in families.feeding("kv_cache_usage_ratio")]
_NEW_USAGE: Final = frozenset(_USAGE_NAMES[:1])
_OLD_USAGE: Final = frozenset(_USAGE_NAMES[1:])
# A cache_config_info without is_attention_free (added to CacheConfig on 2024-10-11).
_NO_ATTENTION_FREE_CLUE: Final = _Clue(high=(0, 6, 2))


def guess_vllm_version(snapshot: VllmSnapshot) -> str:
    """Guess the vLLM version range from what the payload exposes.

    Returns ``">=0.30"``, ``"0.9.2-0.10.x"``, ``"<=0.6.2"`` or ``"unknown"`` (no clue, or
    clues that contradict each other). Only what is *present* counts, except inside
    ``cache_config_info``, whose label set is complete in every vLLM.
    """
    clues = [_FAMILY_CLUES[name] for name in snapshot.families if name in _FAMILY_CLUES]
    config_labels: set[str] = set()
    for engine in snapshot.engines.values():
        if engine.cache_config is not None:
            config_labels.update(engine.cache_config.labels)
    clues += [_LABEL_CLUES[name] for name in config_labels if name in _LABEL_CLUES]
    if config_labels and "is_attention_free" not in config_labels:
        clues.append(_NO_ATTENTION_FREE_CLUE)
    if snapshot.engine_labelled:
        clues.append(_ENGINE_LABEL_CLUE)
    if snapshot.families.isdisjoint(_NEW_USAGE) and not snapshot.families.isdisjoint(_OLD_USAGE):
        clues.append(_OLD_USAGE_ONLY_CLUE)

    lows = [clue.low for clue in clues if clue.low is not None]
    highs = [clue.high for clue in clues if clue.high is not None]
    low = max(lows) if lows else None
    high = min(highs, key=_last_release) if highs else None
    if high is None:
        return "unknown" if low is None else f">={_version(low)}"
    if low is None:
        return f"<={_upper(high)}"
    if low > _last_release(high):
        return "unknown"  # contradicting clues: better no guess than a wrong one
    if low == high:
        return _upper(high)
    return f"{_version(low)}-{_upper(high)}"


def _last_release(high: tuple[int, ...]) -> tuple[float, ...]:
    # (0, 11) stands for every 0.11.x: it sorts after any (0, 11, n).
    return high if len(high) > 2 else (*high, math.inf)


def _version(parts: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in parts)


def _upper(high: tuple[int, ...]) -> str:
    # A two-part upper bound is a release series: (0, 10) -> "0.10.x".
    return _version(high) + (".x" if len(high) == 2 else "")
