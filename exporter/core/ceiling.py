"""The concurrency ceiling: the smallest of every limit vLLM's scheduler applies, and its name.

vLLM admits a sequence only while every limit allows it: a KV pool with room for its blocks, a
free running slot under ``max_num_seqs``, an awake engine, and (0.32+, when set) room under the
API server's admission caps, past which it refuses requests with 503 instead of queueing them
(``AsyncLLM.check_admission`` of vLLM 0.33.0). The ceiling is the minimum of those
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
class QueueCaps:
    """vLLM's admission caps, as declared on its command line (None: not set, no cap).

    ``requests`` (``--max-num-queued-reqs``) counts every unfinished request of the API server,
    waiting or running, over all its engines, a request of ``n`` samples as ``n``;
    ``tokens`` (``--max-num-queued-tokens``) the prompt tokens of requests still in prefill,
    which no metric shows: only its rejections tell that it binds.
    """

    requests: int | None = None
    tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RunningLimit:
    """The most sequences one engine's scheduler runs at once, and where that was learnt."""

    sequences: int
    #: A :class:`~exporter.core.reasons.MaxNumSeqsSource` value.
    source: str
    #: The API server's admission caps, where declared (they bind the server, not one engine).
    queue_caps: QueueCaps | None = None


def queue_room(caps: QueueCaps | None, *, in_flight: float | None, rejecting: bool) -> float | None:
    """Sequences the API server still admits now under its admission caps; None: no cap known.

    vLLM refuses a request of ``n`` when ``in_flight + n > requests``, so the room is
    ``requests - in_flight`` (never below 0: the scheduler's gauges lag the API server's count).
    Rejections in the rate window prove a cap binds even where its value is not declared (the
    token cap, or a cap in a config file): the room is then 0.
    """
    if rejecting:
        return 0.0
    if caps is None or caps.requests is None or in_flight is None:
        return None
    return max(0.0, float(caps.requests) - in_flight)


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
    queue_cap: float | None = None,
) -> Ceiling | None:
    """The ceiling of sequences under the KV pool, the running limit, the sleep state and the cap.

    On a tie the scheduler's limit is named: raising the KV pool alone would not help; and the
    admission cap before the running limit, since requests past it are refused, not queued.
    ``queue_cap``: the sequences the admission cap lets in (None: no cap). None when neither the
    pool nor the running limit nor a cap is known.
    """
    if asleep:
        return Ceiling(0.0, Limit.ENGINE_ASLEEP, kv_sequences)
    if queue_cap is not None and all(
        other is None or queue_cap <= other for other in (running_limit, kv_sequences)
    ):
        return Ceiling(float(queue_cap), Limit.QUEUE_CAP, kv_sequences)
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
    queue_room: float | None = None,
) -> Ceiling | None:
    """How many more sequences vLLM would start now, and the limit that stops the next one.

    ``running_limit - running`` is the scheduler's free slots (never below 0: a limit learnt
    late or lowered can sit under the running count); ``kv_available`` what the free KV holds;
    ``queue_room`` what the admission caps still let in (:func:`queue_room`).
    """
    if asleep:
        return Ceiling(0.0, Limit.ENGINE_ASLEEP, kv_available)
    slots = None
    if running_limit is not None and running is not None:
        slots = max(0.0, float(running_limit) - running)
    return ceiling(kv_available, running_limit=slots, queue_cap=queue_room)


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
