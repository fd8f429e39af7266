"""The traffic shape a sweep sends: prompt and output lengths, and where they came from.

A :class:`TrafficShape` is a pool of request shapes (prompt tokens, output tokens) that the sweep
draws from in a seeded order. It comes from one of three places:

- **vLLM's own histograms** (:func:`shape_from_histograms`): ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens`` count finished requests per bucket (vLLM's 1-2-5 buckets up to
  ``max_model_len``), since the server started or over a window (bucket deltas). Each histogram
  becomes ``samples`` lengths by stratified inverse-CDF sampling: the ``i``-th length is the
  ``(i + 0.5) / samples`` quantile, so every bucket gets its share of the samples, and within a
  bucket the lengths spread from its lower to its upper bound. Spread evenly (PromQL's
  ``histogram_quantile`` assumption) the mean would be each bucket's midpoint, off by up to half a
  bucket; the histogram's ``_sum`` gives the exact mean, so the spread inside every bucket is bent
  (``lower + width x u^a``, one exponent ``a`` for all buckets, found by bisection) until the
  samples' mean matches it. No sample leaves its bucket, so every quantile stays within the bucket
  resolution, which is all a histogram knows: the ``q`` quantile of the samples lies in the bucket
  holding the source's ``q`` quantile, or (a bucket boundary within half a sample of it) in the one
  holding its ``q - 1/(2 samples)`` quantile. The mean is the source's to a hundredth of a token,
  unless rounding each bucket's share to whole samples puts it out of reach; then it is off by at
  most half the observed span (lowest to highest bound with observations) over the sample count.
  Observations above the last finite bound (vLLM's ``+Inf`` bucket, up to ``max_model_len``)
  spread up to ``max_model_len``.
- **A file of recorded lengths** (:func:`parse_lengths`): one request per line.
- **Explicit lengths** (:func:`fixed_shape`): every request the same.

Prompt and output histograms are separate marginals: which prompt went with which output is not
recorded. Histogram shapes pair them independently (a seeded shuffle of the outputs), which keeps
both marginals and the mean context exactly; the p95 context of the pairs is then below the sum of
the two p95s that the sidecar's conservative ceiling uses (``docs/probe.md``).

Pure: plain values in, plain values out; errors are :class:`~exporter.errors.UsageError`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.core.windows import histogram_increase, merge_buckets
from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.core.snapshot import EngineMetrics, Histogram, VllmSnapshot
    from exporter.core.windows import BucketCounts

#: Samples drawn from each histogram by default: quantiles at half-percent resolution.
DEFAULT_SAMPLES = 200
#: The most request shapes a lengths file may hold.
MAX_LENGTHS = 100_000
#: The longest request (prompt + output tokens) the probe builds and sends: above the longest
#: context any model serves in practice (a few million tokens), and a prompt of it takes about
#: 100 MiB to build; a length past it is a mistake (or a unit error), refused before any load.
MAX_CONTEXT_TOKENS = 4_194_304
_LENGTHS_HELP = "write one request per line as PROMPT_TOKENS,OUTPUT_TOKENS"
#: How far the in-bucket exponent may bend the spread (2^-24 .. 2^24: all mass at a bound).
_EXPONENT_RANGE = 24.0
_BISECTIONS = 60


@dataclass(frozen=True, slots=True)
class RequestShape:
    """One request to send: exact prompt tokens and output tokens (sent with ``ignore_eos``)."""

    prompt_tokens: int
    output_tokens: int

    @property
    def context_tokens(self) -> int:
        """Tokens the request holds in the KV cache when it finishes."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class TrafficShape:
    """The pool of request shapes a sweep draws from, and a line saying where it came from."""

    requests: tuple[RequestShape, ...]
    source: str

    def _mean(self, values: Sequence[int]) -> float:
        return math.fsum(values) / len(values)

    @property
    def mean_prompt_tokens(self) -> float:
        """Mean prompt length."""
        return self._mean([r.prompt_tokens for r in self.requests])

    @property
    def mean_output_tokens(self) -> float:
        """Mean output length."""
        return self._mean([r.output_tokens for r in self.requests])

    @property
    def mean_context_tokens(self) -> float:
        """Mean context (prompt + output) length."""
        return self._mean([r.context_tokens for r in self.requests])

    def context_quantile(self, q: float) -> int:
        """The ``q`` quantile of the context lengths (nearest rank: a length that is sent)."""
        return nearest_rank(sorted(r.context_tokens for r in self.requests), q)

    @property
    def max_context_tokens(self) -> int:
        """The longest context in the pool."""
        return max(r.context_tokens for r in self.requests)


def nearest_rank(ordered: Sequence[int], q: float) -> int:
    """The ``q`` quantile of ascending values by nearest rank (the smallest with rank >= q n)."""
    if not ordered:
        raise ValueError("no values")
    index = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[min(index, len(ordered) - 1)]


def fixed_shape(prompt_tokens: int, output_tokens: int) -> TrafficShape:
    """Every request with the same lengths (``--prompt-tokens``, ``--output-tokens``)."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise UsageError(
            f"--prompt-tokens {prompt_tokens} and --output-tokens {output_tokens}: both must be "
            "at least 1"
        )
    if prompt_tokens + output_tokens > MAX_CONTEXT_TOKENS:
        raise UsageError(
            f"--prompt-tokens {prompt_tokens} and --output-tokens {output_tokens} make a "
            f"{prompt_tokens + output_tokens:,}-token request; the probe sends at most "
            f"{MAX_CONTEXT_TOKENS:,} tokens a request: give shorter lengths"
        )
    return TrafficShape(
        (RequestShape(prompt_tokens, output_tokens),),
        f"explicit: {prompt_tokens} prompt + {output_tokens} output tokens",
    )


# -- histograms -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Stratum:
    """Where one sample falls: its bucket's integer range and its position in the bucket."""

    low: int
    high: int
    #: Position within the bucket, in (0, 1].
    u: float

    def value(self, exponent: float) -> int:
        if self.high <= self.low:
            return self.low
        spread: float = self.low - 1 + (self.high - self.low + 1) * self.u**exponent
        return min(self.high, max(self.low, math.ceil(spread)))


def _strata(buckets: BucketCounts, samples: int, *, cap: int | None) -> list[_Stratum]:
    """The bucket and in-bucket position of each of ``samples`` evenly spaced quantiles."""
    total = buckets.total
    cumulative = list(itertools.accumulate(buckets.counts))
    finite = [b for b in buckets.bounds if not math.isinf(b)]
    out: list[_Stratum] = []
    for i in range(samples):
        rank = (i + 0.5) / samples * total
        j = min(bisect.bisect_left(cumulative, rank), len(cumulative) - 1)
        while buckets.counts[j] <= 0 and j + 1 < len(cumulative):
            j += 1
        before = cumulative[j] - buckets.counts[j]
        u = min(1.0, max(1e-9, (rank - before) / buckets.counts[j]))
        lower = buckets.bounds[j - 1] if j else 0.0
        upper = buckets.bounds[j]
        if math.isinf(upper):
            # Above the last finite bound: up to max_model_len when known, else at the bound.
            edge = finite[-1] if finite else 1.0
            upper = float(cap) if cap is not None and cap > edge else edge
            lower = edge if upper > edge else edge - 1
        low = max(1, math.floor(lower) + 1)
        high = max(low, math.floor(upper))
        if cap is not None:
            high = min(high, cap)
            low = min(low, high)
        out.append(_Stratum(low, high, u))
    return out


def _mean_of(strata: Sequence[_Stratum], exponent: float) -> float:
    return math.fsum(s.value(exponent) for s in strata) / len(strata)


def lengths_from_buckets(
    buckets: BucketCounts, samples: int, *, cap: int | None = None
) -> tuple[int, ...]:
    """``samples`` lengths (ascending) with the buckets' distribution and their exact mean.

    See the module docstring. ``cap`` (``max_model_len``) bounds the lengths; the ``+Inf`` bucket
    spreads up to it. Raises ValueError on an empty histogram.
    """
    if buckets.total <= 0:
        raise ValueError("empty histogram")
    strata = _strata(buckets, samples, cap=cap)
    target = buckets.mean
    exponent = 1.0
    if target is not None:
        low_log, high_log = -_EXPONENT_RANGE, _EXPONENT_RANGE
        # The mean falls as the exponent grows (u^a < u for a > 1): bisect on log2(a).
        if target >= _mean_of(strata, 2.0**low_log):
            exponent = 2.0**low_log
        elif target <= _mean_of(strata, 2.0**high_log):
            exponent = 2.0**high_log
        else:
            for _ in range(_BISECTIONS):
                middle = (low_log + high_log) / 2
                if _mean_of(strata, 2.0**middle) > target:
                    low_log = middle
                else:
                    high_log = middle
            exponent = 2.0 ** ((low_log + high_log) / 2)
    return tuple(sorted(s.value(exponent) for s in strata))


def snapshot_buckets(
    after: VllmSnapshot, before: VllmSnapshot | None = None
) -> tuple[BucketCounts | None, BucketCounts | None]:
    """Prompt and generation observations of every engine: since start, or since ``before``."""

    def merged(pick: Callable[[EngineMetrics], Histogram | None]) -> BucketCounts | None:
        parts = []
        for name, engine in after.engines.items():
            current = pick(engine)
            if current is None:
                continue
            old = before.engines.get(name) if before is not None else None
            delta = histogram_increase(pick(old) if old is not None else None, current)
            if delta is not None:
                parts.append(delta)
        return merge_buckets(parts)

    return merged(lambda e: e.prompt_tokens), merged(lambda e: e.generation_tokens)


def shape_from_histograms(
    prompt: BucketCounts | None,
    generation: BucketCounts | None,
    *,
    source: str,
    samples: int = DEFAULT_SAMPLES,
    max_model_len: int | None = None,
    seed: int = 0,
) -> TrafficShape:
    """The traffic shape of vLLM's per-request histograms (see the module docstring).

    Raises :class:`UsageError` when either histogram has no finished request.
    """
    if samples < 1:
        raise UsageError(f"--shape-samples is {samples}; give at least 1")
    if prompt is None or generation is None or prompt.total <= 0 or generation.total <= 0:
        raise UsageError(
            f"{source} has no finished requests in vllm:request_prompt_tokens and "
            "vllm:request_generation_tokens; give --prompt-tokens and --output-tokens, "
            "--lengths FILE, or --shape-from a busier server"
        )
    cap = max_model_len
    prompts = lengths_from_buckets(prompt, samples, cap=None if cap is None else max(1, cap - 1))
    outputs = list(lengths_from_buckets(generation, samples, cap=cap))
    # Reproducible pairing on purpose: a seeded shuffle, nothing secret (hence no S311).
    random.Random(seed).shuffle(outputs)  # noqa: S311
    requests = []
    for p, o in zip(prompts, outputs, strict=True):
        output = max(1, o if cap is None else min(o, cap - p))
        requests.append(RequestShape(p, output))
    count = prompt.total
    return TrafficShape(
        tuple(requests),
        f"{source}: {count:,.0f} finished requests' histograms, {samples} samples",
    )


# -- recorded lengths -------------------------------------------------------------------------


def _from_json(line: str) -> tuple[object, object]:
    document = json.loads(line)
    if not isinstance(document, dict):
        raise ValueError("not an object")
    prompt = document.get("prompt_tokens", document.get("input_length"))
    output = document.get("output_tokens", document.get("output_length"))
    return prompt, output


def _as_count(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("not a count")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise ValueError("not a count")
    if number < 1:
        raise ValueError("below 1")
    return number


def _shape_of(prompt: object, output: object) -> RequestShape:
    """One line's request; ValueError when a length is not a count or the request too long."""
    shape = RequestShape(_as_count(prompt), _as_count(output))
    if shape.context_tokens > MAX_CONTEXT_TOKENS:
        raise ValueError("too long")
    return shape


def parse_lengths(text: str, *, where: str) -> TrafficShape:
    """Request shapes from a file's text: ``PROMPT,OUTPUT`` (or space-separated) per line.

    Blank lines, ``#`` comments and a ``prompt_tokens,output_tokens`` header are skipped; JSON
    lines with ``prompt_tokens`` and ``output_tokens`` (or a trace's ``input_length`` and
    ``output_length``) are read too. Raises :class:`UsageError` naming the first bad line.
    """
    requests: list[RequestShape] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or line.lower().startswith(("prompt", "input")):
            continue
        try:
            if line.startswith("{"):
                prompt, output = _from_json(line)
            else:
                parts = line.replace(",", " ").replace("\t", " ").split()
                if len(parts) != 2:
                    raise ValueError("not two numbers")
                prompt, output = parts
            requests.append(_shape_of(prompt, output))
        except (ValueError, RecursionError):
            # RecursionError: a JSON line nested deeper than the parser recurses.
            shown = line if len(line) <= 40 else line[:37] + "..."
            raise UsageError(
                f"{where} line {number} ({shown!r}) is not two token counts >= 1 of at most "
                f"{MAX_CONTEXT_TOKENS:,} tokens together; {_LENGTHS_HELP}"
            ) from None
        if len(requests) > MAX_LENGTHS:
            raise UsageError(f"{where} has more than {MAX_LENGTHS:,} requests; give a sample")
    if not requests:
        raise UsageError(f"{where} holds no request lengths; {_LENGTHS_HELP}")
    return TrafficShape(tuple(requests), f"{where}: {len(requests):,} recorded requests")


def check_fits(shape: TrafficShape, max_model_len: int | None) -> None:
    """Raise :class:`UsageError` when a request is longer than the target serves.

    Whatever the target says (``max_model_len`` None: it does not say), no request may pass
    :data:`MAX_CONTEXT_TOKENS`.
    """
    longest = shape.max_context_tokens
    if longest > MAX_CONTEXT_TOKENS:
        raise UsageError(
            f"the traffic shape has a {longest:,}-token request; the probe sends at most "
            f"{MAX_CONTEXT_TOKENS:,} tokens a request: send shorter requests"
        )
    if max_model_len is not None and longest > max_model_len:
        raise UsageError(
            f"the traffic shape has a {longest}-token request but the target's max_model_len is "
            f"{max_model_len}; send shorter requests"
        )
