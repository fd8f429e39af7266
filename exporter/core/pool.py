"""How many blocks of vLLM's KV pool one sequence takes, group by group.

vLLM (0.24 and later) gives each KV-cache group of layers its own block table in one shared pool
of blocks: a sequence of T tokens takes ``ceil(T / block)`` blocks in a full-attention group, at
most its window's in a sliding-window or chunked-local one, and the same few in a state (Mamba,
linear attention) group whatever T is. vLLM's labels say only what a sequence of
``max_model_len`` takes in all (``num_gpu_blocks / kv_cache_max_concurrency``); the groups come
from the model's config (the sizing model, :func:`exporter.sizing.model.kv_cache_groups`). With
them a live pool's blocks say how many shorter sequences it holds: the sidecar's ceilings.

Pure: frozen data and arithmetic, one place for the per-group rule (the sizing model's
``blocks_per_sequence`` is this one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from exporter.core.exact import MAX_EXACT_WHOLE

__all__ = ["GroupBlocks", "GroupKind", "PoolLayout", "labelled_max_len_blocks"]

#: A KV-cache group's kind: an attention kind, or ``state`` (Mamba / linear-attention layers).
GroupKind = Literal["full", "sliding", "chunked", "state"]


@dataclass(frozen=True, slots=True)
class GroupBlocks:
    """One KV-cache group as its block table sees a sequence.

    ``window``: a sliding or chunked-local group's window (None: none). ``block_size``: this
    group's tokens per block (Gemma 4 raises some groups' to unify page sizes).
    ``max_blocks``: what vLLM's admission reserves at most for one request in this group: a
    state group's fixed few whatever the length; for a window, its blocks plus those of the
    tokens in flight (``max_admission_blocks_per_request``: out-of-window blocks are freed only
    as tokens are processed), or a max-length request's when that is less; None: no bound.
    """

    kind: GroupKind
    window: int | None
    block_size: int
    max_blocks: int | None = None

    def blocks_for(self, tokens: int) -> int:
        """Blocks vLLM 0.32 reserves for a sequence of ``tokens`` in this group.

        ``min(ceil(tokens / block), max_blocks)`` (``get_num_blocks_to_allocate`` with the
        admission cap); a state group's blocks do not depend on the length.
        """
        if self.kind == "state":
            return self.max_blocks or 0
        full = math.ceil(tokens / self.block_size)
        return full if self.max_blocks is None else min(full, self.max_blocks)


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """Every KV-cache group of one engine's pool; ``lookahead_tokens``: speculative slots.

    ``max_len_blocks`` is what vLLM's admission takes for one request of ``max_model_len`` by
    this layout (a window's blocks there include the batch budget's in-flight tokens,
    ``max_admission_blocks_per_request``): the figure a live pool's labels state too
    (``num_gpu_blocks / kv_cache_max_concurrency``), so the two can be compared.
    """

    groups: tuple[GroupBlocks, ...]
    max_model_len: int
    max_len_blocks: int
    lookahead_tokens: int = 0

    def agrees(self, *, max_model_len: int, max_len_blocks: float) -> bool:
        """Whether a live pool's figures are this layout's: trust it for other lengths then."""
        return self.max_model_len == max_model_len and self.max_len_blocks == max_len_blocks

    def blocks_per_sequence(self, context_tokens: int) -> int:
        """Blocks one sequence of ``context_tokens`` (at least 1) holds, over all groups."""
        tokens = max(1, context_tokens) + self.lookahead_tokens
        return sum(group.blocks_for(tokens) for group in self.groups)


def labelled_max_len_blocks(blocks: float, concurrency: float) -> int | None:
    """Blocks one ``max_model_len`` request takes by a live pool's labels, or None.

    vLLM states ``kv_cache_max_concurrency = num_gpu_blocks / (blocks one max-length request
    takes, summed over the groups)``, so the ratio is that sum. A request takes at least a
    block, so a ratio under 1 (a concurrency over the blocks), not finite or past 2**53
    (``5e-324`` makes it infinite) is no vLLM's: None.
    """
    if concurrency <= 0:
        return None
    ratio = blocks / concurrency
    if not (math.isfinite(ratio) and 1.0 <= ratio <= MAX_EXACT_WHOLE):
        return None
    return round(ratio)
