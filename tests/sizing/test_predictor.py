"""Specification of the sizing model applied to a live target's facts."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

import pytest

from exporter.core.snapshot import CacheConfig, EngineMetrics, VllmSnapshot
from exporter.core.views import GpuMemoryView, TargetInfo
from exporter.errors import UsageError
from exporter.sizing import predictor as predictor_module
from exporter.sizing.model import size_deployment
from exporter.sizing.predictor import ModelPredictor
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

CONFIGS = paths.CONFIGS
CAPTURES = paths.CAPTURES
GIB = 1024**3
H100_CUDA_BYTES = int(79.19 * GIB)


def h100(index: int = 0) -> GpuMemoryView:
    """An H100 as NVML reports it, with CUDA's view of its total."""
    return GpuMemoryView(
        index=str(index),
        uuid=f"GPU-{index}",
        name="NVIDIA H100 80GB HBM3",
        total_bytes=81_559 * 1024**2,
        used_bytes=0,
        free_bytes=81_559 * 1024**2,
        cuda_total_bytes=H100_CUDA_BYTES,
    )


def snapshot(cache: CacheConfig) -> VllmSnapshot:
    """A one-engine snapshot with this cache config."""
    return VllmSnapshot(engines={"0": EngineMetrics(engine="0", cache_config=cache)})


def test_the_tiny_cpu_model_predicts_exactly_the_pool_vllm_reported() -> None:
    """The real 0.32 capture's 1 MiB pool of the tiny model is 1,024 tokens, predicted exactly."""
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("tiny", str(CONFIGS / "tiny-llama"), 512, "0.32.0")
    assert predictor.load(info) is None
    snap = parse_vllm_metrics((CAPTURES / "vllm-0.32.0-cpu-idle.prom").read_bytes())
    prediction = predictor.predict(snap, info, ())
    assert prediction.state == "ok"
    assert prediction.bytes_per_token == 1024
    assert prediction.capacity_tokens == 1024
    assert prediction.info["block_size"] == "128"


def test_llama_8b_on_an_h100_uses_vllms_own_utilization_and_block_size() -> None:
    """Llama 3.1 8B at utilization 0.9 on an H100: 128 KiB per token, ~52 GiB budget."""
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192, "0.19.0")
    assert predictor.load(info) is None
    cache = CacheConfig(gpu_memory_utilization=0.9, block_size=16, cache_dtype="auto")
    prediction = predictor.predict(snapshot(cache), info, (h100(),))
    assert prediction.state == "ok"
    assert prediction.bytes_per_token == 131_072
    assert prediction.kv_budget_bytes is not None
    assert 50 * GIB < prediction.kv_budget_bytes < 56 * GIB
    assert prediction.capacity_tokens is not None
    per_token = prediction.kv_budget_bytes / 131_072
    assert prediction.capacity_tokens == pytest.approx(per_token, rel=0.01)


def test_fp8_kv_cache_from_cache_config_doubles_the_predicted_tokens() -> None:
    """cache_dtype fp8 halves bytes per token, so the same budget holds twice the tokens."""
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192, "0.19.0")
    predictor.load(info)
    auto = predictor.predict(snapshot(CacheConfig(0, 16, cache_dtype="auto")), info, (h100(),))
    fp8 = predictor.predict(snapshot(CacheConfig(0, 16, cache_dtype="fp8")), info, (h100(),))
    assert auto.capacity_tokens is not None
    assert fp8.capacity_tokens is not None
    assert fp8.bytes_per_token == 65_536
    assert fp8.capacity_tokens == pytest.approx(2 * auto.capacity_tokens, rel=0.001)


def test_tensor_parallelism_follows_the_number_of_gpus_vllm_sees() -> None:
    """Two GPUs visible to vLLM mean TP 2: half the KV heads per GPU."""
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192, "0.19.0")
    predictor.load(info)
    cache = CacheConfig(gpu_memory_utilization=0.9, block_size=16)
    prediction = predictor.predict(snapshot(cache), info, (h100(0), h100(1)))
    assert prediction.bytes_per_token == 65_536
    assert prediction.info["tensor_parallel"] == "2"


def test_the_same_inputs_give_the_last_prediction_and_any_change_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A running vLLM's facts are fixed: the sizing runs again only when an input changed."""
    sized: list[object] = []
    real = size_deployment

    def counting(*args: Any, **kwargs: Any) -> Any:
        sized.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(predictor_module, "size_deployment", counting)
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192, "0.19.0")
    predictor.load(info)
    cache = CacheConfig(gpu_memory_utilization=0.9, block_size=16)
    first = predictor.predict(snapshot(cache), info, (h100(),))
    again = predictor.predict(
        snapshot(CacheConfig(gpu_memory_utilization=0.9, block_size=16)), info, (h100(),)
    )
    assert again is first
    assert len(sized) == 1
    changed = [
        predictor.predict(
            snapshot(CacheConfig(gpu_memory_utilization=0.8, block_size=16)), info, (h100(),)
        ),
        predictor.predict(snapshot(cache), info, (h100(0), h100(1))),
        predictor.predict(
            snapshot(cache), dataclasses.replace(info, max_model_len=4096), (h100(),)
        ),
    ]
    assert len(sized) == 4
    assert changed[0].kv_budget_bytes != first.kv_budget_bytes
    assert changed[1].info["tensor_parallel"] == "2"
    tiny = TargetInfo("tiny", str(CONFIGS / "tiny-llama"), 512, "0.19.0")
    predictor.load(tiny)  # a rediscovery finding another model: predicted again
    predictor.predict(snapshot(cache), tiny, (h100(),))
    assert len(sized) == 5


def test_a_hub_id_missing_from_the_cache_falls_back_to_the_catalogue(tmp_path: Path) -> None:
    """vLLM serving meta-llama/Llama-3.1-8B-Instruct from elsewhere still gets a prediction."""
    predictor = ModelPredictor(hf_home=tmp_path)
    info = TargetInfo("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", 8192)
    assert predictor.load(info) is None
    prediction = predictor.predict(snapshot(CacheConfig(block_size=16)), info, (h100(),))
    assert prediction.bytes_per_token == 131_072


def test_an_unknown_model_leaves_the_prediction_missing_with_a_reason(tmp_path: Path) -> None:
    """An unfindable model: state model_not_found, the source failure says why."""
    predictor = ModelPredictor(hf_home=tmp_path)
    info = TargetInfo("secret/model-x", "secret/model-x", 4096)
    failure = predictor.load(info)
    assert failure is not None
    assert failure.reason == "model_not_found"
    prediction = predictor.predict(snapshot(CacheConfig()), info, (h100(),))
    assert prediction.state == "model_not_found"
    assert prediction.capacity_tokens is None


def test_a_corrupt_config_is_reported_as_invalid(tmp_path: Path) -> None:
    """A model directory with a broken config.json: state model_config_invalid."""
    (tmp_path / "config.json").write_text("{not json")
    predictor = ModelPredictor(model_roots=(tmp_path,))
    failure = predictor.load(TargetInfo("m", str(tmp_path), 4096))
    assert failure is not None
    assert failure.reason == "model_config_invalid"


def test_without_gpu_memory_the_prediction_says_so() -> None:
    """Fleet mode without NVML or gpu_memory_bytes cannot size a GPU budget."""
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192)
    predictor.load(info)
    prediction = predictor.predict(snapshot(CacheConfig(block_size=16)), info, ())
    assert prediction.state == "no_gpu_memory"
    assert prediction.info["layers"] == "32"


def test_overrides_replace_config_fields_and_bad_ones_are_refused() -> None:
    """model_overrides changes the architecture; an unknown field is a one-line error."""
    predictor = ModelPredictor(overrides={"num_kv_heads": 32}, model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192)
    predictor.load(info)
    cache = CacheConfig(block_size=16, gpu_memory_utilization=0.9)
    prediction = predictor.predict(snapshot(cache), info, (h100(),))
    assert prediction.bytes_per_token == 4 * 131_072
    with pytest.raises(UsageError, match="unknown field 'kv_heads'"):
        ModelPredictor(overrides={"kv_heads": 8})
    with pytest.raises(UsageError, match="positive integer"):
        ModelPredictor(overrides={"num_layers": "32"})


def test_a_root_outside_model_roots_is_not_read_and_the_message_does_not_depend_on_it(
    tmp_path: Path,
) -> None:
    """An existing model, a FIFO, /dev/zero, nothing at all: the same words, nothing opened."""
    model = tmp_path / "model"
    shutil.copytree(CONFIGS / "tiny-llama", model)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opened, it would wait for a writer for 10 s
    messages = set()
    started = time.monotonic()
    for root in (str(model), str(fifo), "/dev/zero", str(tmp_path / "absent")):
        failure = ModelPredictor().load(TargetInfo("acme-private-7b", root, 4096))
        assert failure is not None
        assert failure.reason == "model_not_found"
        messages.add(str(failure).replace(root, "ROOT"))
    assert time.monotonic() - started < 2
    assert len(messages) == 1, messages
    assert "model_roots" in messages.pop()


def test_a_root_outside_model_roots_still_finds_a_catalogue_model_by_name() -> None:
    """vLLM's served id in the catalogue: the prediction comes without opening the path."""
    info = TargetInfo("meta-llama/Llama-3.1-8B-Instruct", "/models/llama", 8192)
    assert ModelPredictor().load(info) is None


def test_a_large_file_as_root_inside_model_roots_is_refused_by_its_size(tmp_path: Path) -> None:
    """A 512 MiB GGUF file (sparse) as root: refused at 1 MiB, in one line, not read."""
    gguf = tmp_path / "model.gguf"
    with gguf.open("wb") as handle:
        handle.truncate(512 * 2**20)
    failure = ModelPredictor(model_roots=(tmp_path,)).load(TargetInfo("m", str(gguf), 4096))
    assert failure is not None
    assert failure.reason == "model_config_invalid"
    assert "is larger than 1 MiB" in str(failure)
    assert "\n" not in str(failure)


def test_a_config_link_leading_outside_model_roots_is_not_followed(tmp_path: Path) -> None:
    """config.json inside the allowed directory, a link to a file outside: refused, unread."""
    allowed = tmp_path / "models"
    (allowed / "m").mkdir(parents=True)
    outside = tmp_path / "outside.json"
    outside.write_text((CONFIGS / "tiny-llama" / "config.json").read_text())
    (allowed / "m" / "config.json").symlink_to(outside)
    failure = ModelPredictor(model_roots=(allowed,)).load(TargetInfo("m", str(allowed / "m"), 512))
    assert failure is not None
    assert "leads outside model_roots" in str(failure)


def test_a_config_link_inside_model_roots_is_followed(tmp_path: Path) -> None:
    """The Hugging Face cache links snapshots to blobs: inside the allowed directory, read."""
    allowed = tmp_path / "models"
    (allowed / "blobs").mkdir(parents=True)
    (allowed / "snapshot").mkdir()
    blob = allowed / "blobs" / "abc"
    blob.write_text((CONFIGS / "tiny-llama" / "config.json").read_text())
    (allowed / "snapshot" / "config.json").symlink_to(blob)
    info = TargetInfo("m", str(allowed / "snapshot"), 512)
    assert ModelPredictor(model_roots=(allowed,)).load(info) is None


def test_a_hub_id_root_is_never_read_as_a_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``org/name`` that is also a directory under the working directory: not opened there."""
    (tmp_path / "acme" / "private").mkdir(parents=True)
    shutil.copy(CONFIGS / "tiny-llama" / "config.json", tmp_path / "acme" / "private")
    monkeypatch.chdir(tmp_path)
    predictor = ModelPredictor(hf_home=tmp_path / "hf")
    failure = predictor.load(TargetInfo("acme/private", "acme/private", 512))
    assert failure is not None
    assert failure.reason == "model_not_found"


@pytest.mark.parametrize(
    "case",
    ["granite-4.0-h", "falcon-h1", "lfm2", "nemotron-h", "qwen3-next", "qwen3-next-ssm-bf16"],
)
def test_a_live_hybrid_is_predicted_from_the_labels_vllm_reported(case: str) -> None:
    """Real 0.32 hybrids: the live prediction equals kv_cache_size_tokens from their metrics.

    The cache_config_info labels recorded from each start (raised block size, mamba cache mode,
    SSM dtype) are fed back as the live metrics; the model directory is the recorded config.
    """
    survey = paths.VLLM_CPU / "architectures"
    labels = json.loads((survey / case / "cache_config_info.json").read_text())
    body = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    snap = parse_vllm_metrics(f"vllm:cache_config_info{{{body}}} 1.0\n".encode())
    predictor = ModelPredictor(model_roots=(survey,))
    info = TargetInfo(case, str(survey / case), 1024, "0.32.0")
    assert predictor.load(info) is None
    prediction = predictor.predict(snap, info, ())
    assert prediction.state == "ok", prediction.message
    assert prediction.capacity_tokens == int(labels["kv_cache_size_tokens"])


@pytest.mark.parametrize(
    ("families", "named"),
    [
        (frozenset({"vllm:lora_requests_info"}), "LoRA adapter buffers"),
        (frozenset({"vllm:spec_decode_num_drafts"}), "speculative decoding"),
    ],
)
def test_claimants_vllm_does_not_size_in_its_labels_are_named_not_guessed(
    families: frozenset[str], named: str
) -> None:
    """vLLM exports these families only with LoRA / a drafter on, but not their sizes.

    The prediction is the same as without them, and its message says what it leaves out.
    """
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192, "0.19.0")
    assert predictor.load(info) is None
    cache = CacheConfig(gpu_memory_utilization=0.9, block_size=16, cache_dtype="auto")
    plain = predictor.predict(snapshot(cache), info, (h100(),))
    engines = {"0": EngineMetrics(engine="0", cache_config=cache)}
    flagged = predictor.predict(VllmSnapshot(engines=engines, families=families), info, (h100(),))
    assert plain.message == ""
    assert flagged.state == "ok"
    assert flagged.capacity_tokens == plain.capacity_tokens
    assert flagged.message.startswith("not accounted: ")
    assert named in flagged.message


def test_an_exact_kv_budget_leaves_nothing_unaccounted() -> None:
    """With kv_cache_memory_bytes vLLM's budget is given: LoRA or a drafter cannot change it."""
    predictor = ModelPredictor(model_roots=(CONFIGS,))
    info = TargetInfo("llama", str(CONFIGS / "llama-3.1-8b-instruct"), 8192, "0.32.0")
    assert predictor.load(info) is None
    cache = CacheConfig(block_size=16, cache_dtype="auto", kv_cache_memory_bytes=4 * GIB)
    engines = {"0": EngineMetrics(engine="0", cache_config=cache)}
    families = frozenset({"vllm:lora_requests_info"})
    prediction = predictor.predict(
        VllmSnapshot(engines=engines, families=families), info, (h100(),)
    )
    assert prediction.state == "ok"
    assert prediction.kv_budget_bytes == 4 * GIB
    assert prediction.message == ""


def _deepseek_v32(tmp_path: Path) -> str:
    """A model directory: DeepSeek-V3's config.json with V3.2's class and indexer fields."""
    config = json.loads((CONFIGS / "deepseek-v3" / "config.json").read_text())
    config.update(
        architectures=["DeepseekV32ForCausalLM"],
        model_type="deepseek_v32",
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_a_live_deepseek_v32_is_predicted_from_its_fp8_ds_mla_labels(tmp_path: Path) -> None:
    """8 H100s, cache_dtype fp8_ds_mla, block 64, 10 GiB of KV, max-model-len 32,768.

    Per token per layer 656 (fp8_ds_mla) + 132 (indexer key) = 788 B, x 61 = 48,068 B; a block
    64 x 48,068 = 3,076,352 B; 10 GiB // that = 3,490 blocks, one group needing cdiv(32,768, 64)
    = 512 per request: int(3,490 / 512 x 32,768) = 223,360 tokens (vLLM 0.32 source arithmetic).
    """
    predictor = ModelPredictor(model_roots=(tmp_path,))
    info = TargetInfo("deepseek-v3.2", _deepseek_v32(tmp_path), 32_768, "0.32.0")
    assert predictor.load(info) is None
    cache = CacheConfig(block_size=64, cache_dtype="fp8_ds_mla", kv_cache_memory_bytes=10 * GIB)
    prediction = predictor.predict(snapshot(cache), info, tuple(h100(i) for i in range(8)))
    assert prediction.state == "ok"
    assert prediction.bytes_per_token == 48_068
    assert prediction.capacity_tokens == 223_360
    assert prediction.info["attention"] == "sparse MLA + indexer"


def test_a_live_deepseek_v32_without_gpus_is_unsupported_in_one_line(tmp_path: Path) -> None:
    """No GPUs and an exact budget means vLLM's CPU backend, which has no sparse-MLA attention."""
    predictor = ModelPredictor(model_roots=(tmp_path,))
    info = TargetInfo("deepseek-v3.2", _deepseek_v32(tmp_path), 32_768, "0.32.0")
    predictor.load(info)
    cache = CacheConfig(block_size=64, cache_dtype="auto", kv_cache_memory_bytes=10 * GIB)
    prediction = predictor.predict(snapshot(cache), info, ())
    assert prediction.state == "model_unsupported"
    assert "CPU" in prediction.message
    assert "\n" not in prediction.message
