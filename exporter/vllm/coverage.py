"""Which of the ``vllm:`` families the headroom figures need a payload lacks, and what for.

A partial capture (someone saved only the histograms, or a proxy filtered the families) still
gets every figure it can support; this says what the rest would need, in words a user can act
on. Pure: works on the family names the parser found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.vllm import families

if TYPE_CHECKING:
    from collections.abc import Iterable


@dataclass(frozen=True, slots=True)
class Needed:
    """A family (any of its names across vLLM versions) and the figures that depend on it."""

    names: tuple[str, ...]
    needed_for: str

    @property
    def family(self) -> str:
        """The current name (the first one)."""
        return self.names[0]


#: The families the derived figures read (the table's ``needed_for`` rows, in its order), each
#: with the older names of the same figure, newest first, as ``# TYPE`` lines name them.
NEEDED: tuple[Needed, ...] = tuple(
    Needed(
        (
            row.type_name,
            *(old.type_name for old in families.FAMILIES if old.replaced_by == row.name),
        ),
        row.needed_for,
    )
    for row in families.FAMILIES
    if row.needed_for is not None
)


def missing_families(present: Iterable[str]) -> list[Needed]:
    """The needed families of which no name is in ``present``, in :data:`NEEDED` order."""
    names = set(present)
    return [needed for needed in NEEDED if not names.intersection(needed.names)]


#: Names shown when a payload's ``vllm:`` series are listed in a message.
SHOWN_NAMES = 8
#: A ``vllm:`` metric name at the start of a sample or comment line (found, not parsed).
_VLLM_NAME = re.compile(rb"^(?:# (?:TYPE|HELP) )?[ \t]*(vllm:[A-Za-z0-9_:]+)", re.MULTILINE)


def vllm_names_in(payload: bytes, *, limit: int = 1000) -> list[str]:
    """The distinct ``vllm:`` names a payload writes, in order, at most ``limit`` of them.

    A scan, not a parse: the parser skips the families it does not read without looking at
    them, so a capture of only those has no family the snapshot knows.
    """
    names: dict[str, None] = {}
    for match in _VLLM_NAME.finditer(payload):
        name = match.group(1).decode("ascii")
        names.setdefault(name, None)
        if len(names) >= limit:
            break
    return list(names)


_SAMPLE_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _found_names(families: set[str], written: list[str]) -> set[str]:
    """The families the parser knows, and the other names written (histogram samples folded)."""
    found = set(families)
    for name in written:
        stem = next((name.removesuffix(s) for s in _SAMPLE_SUFFIXES if name.endswith(s)), name)
        if stem not in families:
            found.add(name)
    return found


def unusable_reason(payload: bytes, families: Iterable[str]) -> str | None:
    """Why a payload gives no figure at all, as a phrase after its name; None when it does.

    No ``vllm:`` name: not vLLM's ``/metrics``. ``vllm:`` families (a sample, or only a
    ``# HELP``/``# TYPE`` line) but none of :data:`NEEDED`: a partial capture, said with the
    families it names and those needed.
    """
    present = set(families)
    if len(missing_families(present)) < len(NEEDED):
        return None
    found = sorted(_found_names(present, vllm_names_in(payload)))
    if not found:
        return "has no vLLM metrics (no vllm: series); is it a vLLM /metrics payload?"
    shown = ", ".join(found[:SHOWN_NAMES])
    more = f" and {len(found) - SHOWN_NAMES} more" if len(found) > SHOWN_NAMES else ""
    needed = ", ".join(n.family for n in NEEDED)
    return (
        f"has vllm: families ({shown}{more}) but none of those the figures need ({needed}); "
        "save the whole /metrics payload"
    )
