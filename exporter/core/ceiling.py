"""The concurrency ceiling: the smallest of every limit vLLM's scheduler applies, and its name.

vLLM admits a sequence only while every limit allows it: a KV pool with room for its blocks, a
free running slot under ``max_num_seqs``, an awake engine. The ceiling is the minimum of those
limits and the headroom is what is left under each of them now, so a headline number never says
"300 more fit" while requests queue behind a full scheduler. ``plan`` and the sidecar share these
functions, so both name the same binding limit for the same inputs.

Pure functions over plain numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.core.reasons import Limit


@dataclass(frozen=True, slots=True)
class RunningLimit:
    """The most sequences one engine's scheduler runs at once, and where that was learnt."""

    sequences: int
    #: A :class:`~exporter.core.reasons.MaxNumSeqsSource` value.
    source: str


@dataclass(frozen=True, slots=True)
class Ceiling:
    """Sequences that fit at once under every limit, and the limit that binds."""

    sequences: float
    limited_by: Limit
    #: What the KV pool alone would hold (None when the pool is unknown).
    kv_sequences: float | None

    @property
    def flags(self) -> dict[str, float]:
        """1 for the binding limit and 0 for every other: the one-hot gauge."""
        return {limit: 1.0 if limit == self.limited_by else 0.0 for limit in Limit}


def ceiling(
    kv_sequences: float | None,
    *,
    running_limit: float | None,
    asleep: bool = False,
) -> Ceiling | None:
    """The ceiling of sequences under the KV pool, the running limit and the sleep state.

    On a tie the scheduler's limit is named: raising the KV pool alone would not help. None when
    neither the pool nor the running limit is known.
    """
    if asleep:
        return Ceiling(0.0, Limit.ENGINE_ASLEEP, kv_sequences)
    if running_limit is not None and (kv_sequences is None or running_limit <= kv_sequences):
        return Ceiling(float(running_limit), Limit.MAX_NUM_SEQS, kv_sequences)
    if kv_sequences is None:
        return None
    return Ceiling(kv_sequences, Limit.KV_CACHE, kv_sequences)


def headroom(
    kv_available: float | None,
    *,
    running_limit: float | None,
    running: float | None,
    asleep: bool = False,
) -> Ceiling | None:
    """How many more sequences vLLM would start now, and the limit that stops the next one.

    ``running_limit - running`` is the scheduler's free slots (never below 0: a limit learnt
    late or lowered can sit under the running count); ``kv_available`` what the free KV holds.
    """
    if asleep:
        return Ceiling(0.0, Limit.ENGINE_ASLEEP, kv_available)
    slots = None
    if running_limit is not None and running is not None:
        slots = max(0.0, float(running_limit) - running)
    return ceiling(kv_available, running_limit=slots)


def shared_ceiling(
    usable_tokens: float,
    *,
    context_tokens: float,
    shared_tokens: float,
    block_size: int,
) -> float:
    """Sequences of ``context_tokens`` that fit when ``shared_tokens`` of each are shared.

    Blocks a prefix cache hit reuses are held once, however many sequences use them (vLLM
    counts a block by reference). ``n`` sequences then hold the shared part once and their own
    part ``n`` times: ``n = (usable - shared) // own``. ``shared_tokens`` is a mean over requests
    (some hit whole blocks, some none), so the own part is the sequence's whole blocks less that
    mean, and at least one block: vLLM always recomputes a prompt's last token and writes the
    output into blocks of the sequence's own. Never below the unshared figure.
    """
    granule = max(1, block_size)
    per_sequence = max(1, math.ceil(context_tokens / granule)) * granule
    unshared = math.floor(max(usable_tokens, 0.0) / per_sequence)
    shared = min(max(shared_tokens, 0.0), float(per_sequence))
    own = max(float(granule), per_sequence - shared)
    held = max(usable_tokens - shared, 0.0)
    return float(max(unshared, math.floor(held / own)))
