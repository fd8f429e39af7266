"""vLLM version numbers: parsing and ordering.

vLLM's behaviour that the sizing model depends on (default utilization, how the memory profiler
counts CUDA graphs, how the capacity line is computed) changes between releases, so the model
takes the version as an input. Versions arrive as text from ``/version``, from the CLI and from
the calibration data (``"0.19.0"``, ``"v0.10.1rc2"``, ``"0.11.0 (V1)"``, ``"0.6.4.post1"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.errors import UsageError

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
