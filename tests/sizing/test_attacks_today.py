"""Attacks on today's sizing changes: hostile ``cache_config_info`` labels on the predictor.

``_comparable_capacity`` reads ``num_gpu_blocks / kv_cache_max_concurrency`` for a windowed
model. The parser accepts any concurrency from 0 to 2**53 (``exporter/vllm/metrics.py``), so a
5e-324 one made an infinite ratio and an OverflowError on every poll (the poll crashed), and
one above the blocks (no vLLM's: a request takes at least a block) or one that leaves more
than 2**53 blocks per request made up a capacity (32,768 or 0 tokens where vLLM said 2,730).
"""

from __future__ import annotations

import json
import math

import pytest

from exporter.core.views import TargetInfo
from exporter.sizing.predictor import ModelPredictor
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

SURVEY = paths.VLLM_CPU / "architectures"
#: Windowed models of the survey: their prediction reads the concurrency label.
WINDOWED = ("gemma2-batch128", "mistral-swa-batch128", "gemma4")


def _predict(case: str, **overrides: str) -> float | None:
    labels = json.loads((SURVEY / case / "cache_config_info.json").read_text())
    labels.update(overrides)
    body = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    snapshot = parse_vllm_metrics(f"vllm:cache_config_info{{{body}}} 1.0\n".encode())
    predictor = ModelPredictor(model_roots=(SURVEY,))
    info = TargetInfo(case, str(SURVEY / case), 1024, "0.32.0")
    assert predictor.load(info) is None
    found = predictor.predict(snapshot, info, ())
    assert found.state == "ok", found.message
    return found.capacity_tokens


@pytest.mark.parametrize("case", WINDOWED)
@pytest.mark.parametrize("concurrency", ["5e-324", "1e-320", "1e-300", "100", "1e15"])
def test_a_concurrency_no_vllm_gives_leaves_the_models_own_prediction(
    case: str, concurrency: str
) -> None:
    """Never an error, never a made-up figure: the model's own capacity, as with no label."""
    plain = _predict(case, kv_cache_max_concurrency="None")
    found = _predict(case, kv_cache_max_concurrency=concurrency)
    assert found is not None
    assert math.isfinite(found)
    assert found == plain


def test_huge_blocks_and_a_tiny_concurrency_are_never_an_error() -> None:
    """2**53 blocks over 1e-300: a ratio past 2**53, no vLLM's."""
    plain = _predict("gemma2-batch128", kv_cache_max_concurrency="None")
    found = _predict(
        "gemma2-batch128", num_gpu_blocks="9007199254740992", kv_cache_max_concurrency="1e-300"
    )
    assert found == plain


def test_a_changed_capacity_label_predicts_again() -> None:
    """The cached answer is keyed by everything it reads: ``kv_cache_size_tokens`` among them.

    Whether vLLM states its capacity decides whether the prediction is put in its block's
    tokens (2,730 on Gemma 2 with a 128-token batch budget, 1,927 by the model's default).
    """
    case = "gemma2-batch128"
    predictor = ModelPredictor(model_roots=(SURVEY,))
    info = TargetInfo(case, str(SURVEY / case), 1024, "0.32.0")
    assert predictor.load(info) is None
    found = []
    for size in ("None", "2730"):
        labels = json.loads((SURVEY / case / "cache_config_info.json").read_text())
        labels["kv_cache_size_tokens"] = size
        body = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        snapshot = parse_vllm_metrics(f"vllm:cache_config_info{{{body}}} 1.0\n".encode())
        found.append(predictor.predict(snapshot, info, ()).capacity_tokens)
    assert found == [1927, 2730]
