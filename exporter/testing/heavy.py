"""Payloads that make every window sample heavy: what a hostile target sends to fill memory.

Each is a function of the scrape number (``FakeVllm(payload=...)`` takes it as is) and changes
with every scrape, so that no sample can share with the one before: the cases of issue 30's
memory attacks, at a scale the caller chooses (the reliability tests run them small,
``benchmarks/memory.py`` at full size). Every one is a healthy vLLM 0.32 payload
(:func:`~exporter.testing.fakevllm.render_metrics`) plus the heavy part, so the target stays
up and its windows keep filling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.testing.fakevllm import VllmState, render_metrics
from exporter.vllm import families as vllm_families
from exporter.vllm.families import PREFIX, named

if TYPE_CHECKING:
    from collections.abc import Callable

#: The split families whose values a window keeps (rows of exporter.vllm.families).
_SPLIT_FAMILIES = tuple(
    vllm_families.family(named(short))
    for short in (
        "num_requests_waiting_by_reason",
        "engine_sleep_state",
        "prompt_tokens_cached_by_source",
        "prompt_tokens_by_source",
    )
)
_CACHE_CONFIG = named("cache_config_info")


@dataclass(frozen=True, slots=True)
class Heavy:
    """One heavy-payload case: its name and its payload as a function of the scrape number."""

    name: str
    payload: Callable[[int], bytes]


def _base(engines: int, scrape: int) -> str:
    return render_metrics(VllmState(engines=engines, finished=12 + 2 * scrape)).decode()


def help_names(names: int = 2_000) -> Heavy:
    """``names`` new ``# HELP vllm:*`` names every scrape (no sample of them)."""

    def payload(scrape: int) -> bytes:
        helps = "".join(f"# HELP {PREFIX}made_up_{scrape}_{i} Made up.\n" for i in range(names))
        return (_base(1, scrape) + helps).encode()

    return Heavy("help_names", payload)


def long_split_labels(engines: int = 64, values: int = 32, chars: int = 500) -> Heavy:
    """``engines`` x 3 split families x ``values`` series, each value ``chars`` long and new."""

    def payload(scrape: int) -> bytes:
        lines = [_base(engines, scrape)]
        for row in _SPLIT_FAMILIES:
            lines.append(f"# TYPE {row.type_name} {row.kind}\n")
            label = row.split
            for engine in range(engines):
                for i in range(values):
                    value = f"{scrape}-{i}-".ljust(chars, "x")
                    lines.append(
                        f'{row.type_name}{{engine="{engine}",model_name="tiny",'
                        f'{label}="{value}"}} 1.0\n'
                    )
        return "".join(lines).encode()

    return Heavy("long_split_labels", payload)


def cache_config_labels(engines: int = 64, labels: int = 110, chars: int = 64) -> Heavy:
    """``cache_config_info`` of every engine with ``labels`` extra labels, new every scrape."""

    def payload(scrape: int) -> bytes:
        base = _base(engines, scrape)
        extra = ",".join(f'extra_{i}="{scrape}-{i}-'.ljust(chars, "y") + '"' for i in range(labels))
        return base.replace(
            _CACHE_CONFIG + '{block_size="',
            _CACHE_CONFIG + "{" + extra + ',block_size="',
        ).encode()

    return Heavy("cache_config_labels", payload)


def moving_buckets(engines: int = 41, histograms: int = 3, buckets: int = 256) -> Heavy:
    """``histograms`` token histograms an engine with ``buckets`` bounds that move every scrape."""
    families = tuple(
        named(short)
        for short in ("request_prompt_tokens", "request_generation_tokens", "request_params_n")
    )[:histograms]

    def payload(scrape: int) -> bytes:
        base = render_metrics(VllmState(engines=engines, finished=12 + 2 * scrape)).decode()
        # The fake's own token histograms are replaced by the moving ones.
        kept = [
            line
            for line in base.splitlines(keepends=True)
            if not line.startswith(families)
            and not line.startswith(tuple(f"# TYPE {f} " for f in families))
        ]
        lines = ["".join(kept)]
        count = 12 + 2 * scrape
        for family in families:
            lines.append(f"# TYPE {family} histogram\n")
            for engine in range(engines):
                labels = f'engine="{engine}",model_name="tiny"'
                for i in range(buckets - 1):
                    bound = 1.0 + i + scrape / 1000.0
                    cumulative = min(count, i)
                    lines.append(f'{family}_bucket{{{labels},le="{bound}"}} {float(cumulative)}\n')
                lines.append(f'{family}_bucket{{{labels},le="+Inf"}} {float(count)}\n')
                lines.append(f"{family}_count{{{labels}}} {float(count)}\n")
                lines.append(f"{family}_sum{{{labels}}} {float(count * 100)}\n")
        return "".join(lines).encode()

    return Heavy("moving_buckets", payload)


def cases(scale: float = 1.0) -> tuple[Heavy, ...]:
    """The four cases, their engine counts (and names) scaled by ``scale`` (at least one)."""

    def n(full: int) -> int:
        return max(1, round(full * scale))

    return (
        help_names(n(2_000)),
        long_split_labels(engines=n(64)),
        cache_config_labels(engines=n(64)),
        moving_buckets(engines=n(41)),
    )
