"""Which of the ``vllm:`` families the headroom figures need a payload lacks, and what for.

A partial capture (someone saved only the histograms, or a proxy filtered the families) still
gets every figure it can support; this says what the rest would need, in words a user can act
on. Pure: works on the family names the parser found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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


#: The families the derived figures read, newest name first.
NEEDED: tuple[Needed, ...] = (
    Needed(("vllm:cache_config_info",), "KV capacity and the sequences that fit"),
    Needed(
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "tokens in use and free, and the headroom",
    ),
    Needed(("vllm:request_prompt_tokens",), "context length (prompt part)"),
    Needed(("vllm:request_generation_tokens",), "context length (output part)"),
    Needed(("vllm:num_requests_running",), "running requests and the max_num_seqs headroom"),
    Needed(("vllm:num_requests_waiting",), "the queue"),
    Needed(("vllm:num_preemptions_total",), "preemptions"),
    Needed(("vllm:request_success_total",), "finished requests"),
)


def missing_families(present: Iterable[str]) -> list[Needed]:
    """The needed families of which no name is in ``present``, in :data:`NEEDED` order."""
    names = set(present)
    return [needed for needed in NEEDED if not names.intersection(needed.names)]
