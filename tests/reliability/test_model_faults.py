"""Model files the sidecar cannot use: unreadable, corrupt, or of an unsupported architecture.

The exporter process reads the model directory given by ``HEADROOM_MODEL`` when vLLM (the fake)
starts or restarts. Each test breaks the files, restarts the fake vLLM so that the model is read
again, and checks that vLLM's own figures keep coming while the prediction says why it is
missing; then it repairs the files and checks that the sidecar picks them up by itself (it
re-reads failing model files every six polls), without a vLLM restart. An unsupported
architecture is read fine and declined: it ends when vLLM restarts with another model.

Unreadable means EACCES for the exporter. The suite may run as root, whom ``chmod 000`` does
not stop, so as root the exporter runs under ``setpriv`` without the two capabilities that let
root read anything (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): then permissions apply to it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import TYPE_CHECKING

import httpx
import pytest
from structlog.testing import capture_logs

from exporter.core.views import PredictionView, TargetInfo, TargetView
from exporter.sizing.predictor import ModelPredictor
from exporter.testing.fakevllm import FakeVllm, VllmState
from exporter.testing.processes import ExporterProcess, ExporterThread, Scrape
from tests import paths

from .harness import mock_vllm_poller

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

    from exporter.core.snapshot import VllmSnapshot
    from exporter.core.views import GpuMemoryView
    from exporter.errors import SourceError
    from exporter.vllm.launch import LaunchFlags

    from .conftest import Figures

TINY_LLAMA = paths.CONFIGS / "tiny-llama"
POLL_SECONDS = 0.5
#: Without the capabilities that bypass file permissions, root is bound by them like anyone.
AS_UNPRIVILEGED_ROOT = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def predicted(scrape: Scrape) -> bool:
    """The model was read and the prediction is there, next to vLLM's own capacity."""
    return (
        scrape.value("headroom_source_up", source="model_config") == 1.0
        and scrape.value("headroom_prediction_state", state="ok") == 1.0
        and bool(scrape.series("headroom_kv_capacity_predicted_tokens"))
    )


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    """The fake vLLM serving a model the built-in catalogue does not know (no fallback)."""
    with FakeVllm(state=VllmState(model="acme-private-7b", root="/models/acme")) as server:
        yield server


@pytest.fixture
def model_dir(tmp_path: Path) -> Iterator[Path]:
    """A readable copy of the tiny Llama's config.json (permissions restored afterwards)."""
    directory = tmp_path / "model"
    shutil.copytree(TINY_LLAMA, directory)
    yield directory
    directory.chmod(0o755)


@pytest.fixture
def sidecar(fake_vllm: FakeVllm, model_dir: Path) -> Iterator[ExporterProcess]:
    """The exporter predicting from ``model_dir``, healthy at the start."""
    prefix = AS_UNPRIVILEGED_ROOT if os.geteuid() == 0 else []
    exporter = ExporterProcess(
        {
            "HEADROOM_TARGET": fake_vllm.url,
            "HEADROOM_MODEL": str(model_dir),
            "HEADROOM_GPU_MEMORY_BYTES": str(80 * 1024**3),
            "HEADROOM_POLL_INTERVAL_SECONDS": str(POLL_SECONDS),
            "HEADROOM_POLL_TIMEOUT_SECONDS": str(POLL_SECONDS),
        },
        prefix=prefix,
    )
    try:
        exporter.wait_for(predicted)
        yield exporter
    finally:
        exporter.close()


def break_and_repair(
    exporter: ExporterProcess,
    vllm: FakeVllm,
    *,
    name: str,
    state: str,
    reason: str | None,
    breaks: Callable[[], object],
    repairs: Callable[[], object],
    figures: Figures,
    restart_to_repair: bool = False,
) -> None:
    """Break the files, restart vLLM, see ``state`` reported; repair, see the prediction back.

    ``restart_to_repair``: the repair is vLLM restarting with another model (an unsupported
    architecture is not a failure to retry: the files were read fine).
    """
    before = exporter.scrape().errors("model_config", reason) if reason else 0.0
    breaks()
    vllm.restart()
    down, _ = exporter.wait_for(
        lambda s: (
            s.value("headroom_prediction_state", state=state) == 1.0
            and (reason is None or s.errors("model_config", reason) > before)
        )
    )
    assert down.value("headroom_target_up") == 1.0
    assert down.series("headroom_kv_capacity_tokens"), "vLLM's own figures must stay"
    assert not down.series("headroom_kv_capacity_predicted_tokens")
    assert exporter.get("/-/healthy").status_code == 200
    assert exporter.proc.poll() is None
    repaired = time.monotonic()
    repairs()
    if restart_to_repair:
        vllm.restart()
    exporter.wait_for(predicted)
    took = time.monotonic() - repaired
    # Read again within six polls (plus the poll that notices): no vLLM restart needed.
    assert took < 8 * POLL_SECONDS + 3.0
    assert exporter.non_json_lines() == [], "the exporter wrote something else than JSON events"
    figures.record("model_faults", name, {"state": state, "recovered_seconds": round(took, 3)})


def test_an_unreadable_model_directory_is_data_not_a_crash(
    sidecar: ExporterProcess, fake_vllm: FakeVllm, model_dir: Path, figures: Figures
) -> None:
    """A model directory the exporter may not read: model_config_invalid, then read once allowed."""
    break_and_repair(
        sidecar,
        fake_vllm,
        name="unreadable_directory",
        state="model_config_invalid",
        reason="model_config_invalid",
        breaks=lambda: model_dir.chmod(0),
        repairs=lambda: model_dir.chmod(0o755),
        figures=figures,
    )
    events = [e for e in sidecar.events() if e.get("source") == "model_config"]
    assert any("ermission denied" in str(e.get("error")) for e in events)


def test_a_corrupt_config_json_is_data_and_its_repair_is_picked_up(
    sidecar: ExporterProcess, fake_vllm: FakeVllm, model_dir: Path, figures: Figures
) -> None:
    """config.json that is not JSON: model_config_invalid; a fixed file is read by itself."""
    config = model_dir / "config.json"
    good = config.read_text()
    break_and_repair(
        sidecar,
        fake_vllm,
        name="corrupt_config_json",
        state="model_config_invalid",
        reason="model_config_invalid",
        breaks=lambda: config.write_text('{"model_type": "llama", "hidden_'),
        repairs=lambda: config.write_text(good),
        figures=figures,
    )


def test_an_unsupported_architecture_is_declined_with_its_state(
    sidecar: ExporterProcess, fake_vllm: FakeVllm, model_dir: Path, figures: Figures
) -> None:
    """A hybrid state-space config (Zamba2): prediction model_unsupported, vLLM's figures kept."""
    config = model_dir / "config.json"
    good = config.read_text()
    zamba2 = json.loads(good) | {"model_type": "zamba2", "architectures": ["Zamba2ForCausalLM"]}
    break_and_repair(
        sidecar,
        fake_vllm,
        name="unsupported_architecture",
        state="model_unsupported",
        reason=None,
        breaks=lambda: config.write_text(json.dumps(zamba2)),
        repairs=lambda: config.write_text(good),
        figures=figures,
        restart_to_repair=True,
    )


class CrashingPredictor:
    """A predictor with a bug on odd model files: ``load`` raises what no one expected."""

    def load(self, info: TargetInfo) -> SourceError | None:
        raise KeyError("num_hidden_layers")

    def predict(
        self,
        snapshot: VllmSnapshot,
        info: TargetInfo,
        gpus: Sequence[GpuMemoryView],
        flags: LaunchFlags | None = None,
    ) -> PredictionView:
        return PredictionView(state="model_config_invalid", message="not loaded")


def test_a_predictor_crashing_on_odd_files_is_data_not_a_crash() -> None:
    """An unexpected exception reading the model: model_config_invalid, logged, polls go on."""
    _, poll = mock_vllm_poller(predictor=CrashingPredictor())
    with capture_logs() as logs:
        first = poll()
        second = poll()
    assert isinstance(first, TargetView)
    assert isinstance(second, TargetView)
    assert first.sources["model_config"].errors == {"model_config_invalid": 1}
    assert first.sources["vllm_metrics"].up
    assert second.derived is not None
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["model_load_crashed"]


def test_a_corrupt_safetensors_index_costs_the_weights_figure_only(tmp_path: Path) -> None:
    """A corrupt model.safetensors.index.json: the model loads, weights come from parameters."""
    directory = tmp_path / "model"
    shutil.copytree(TINY_LLAMA, directory)
    (directory / "model.safetensors.index.json").write_text('{"metadata": {"total_si')
    predictor = ModelPredictor(model=str(directory))
    assert predictor.load(TargetInfo(model_id="acme-private-7b")) is None


def _model_lines(body: str, root: str) -> list[str]:
    """The lines of a /probe answer about the model (the root itself replaced by ROOT).

    Durations are left out: they differ from one read to the next whatever was read.
    """
    words = ("prediction", "model_config", "predicted")
    return sorted(
        line.replace(root, "ROOT")
        for line in body.splitlines()
        if not line.startswith("#")
        and any(word in line for word in words)
        and "_duration_seconds" not in line
    )


def test_probe_answers_reveal_nothing_about_the_exporters_files(tmp_path: Path) -> None:
    """A target's root of a real model, a 512 MiB file, a FIFO, /dev/zero or nothing: one answer.

    Fleet mode, no model_roots: the answer comes at once (no FIFO waited on, nothing read) and
    says the same about every root.
    """
    model = tmp_path / "model"
    shutil.copytree(TINY_LLAMA, model)
    gguf = tmp_path / "model.gguf"
    with gguf.open("wb") as handle:
        handle.truncate(512 * 2**20)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    roots = [str(model), str(gguf), str(fifo), "/dev/zero", str(tmp_path / "absent")]
    answers = []
    settings = {"mode": "fleet", "probe_allowlist": "127.0.0.0/8", "gpu_memory_bytes": 80 * 2**30}
    with ExporterThread(settings) as running:
        for root in roots:
            with FakeVllm(state=VllmState(model="acme-private-7b", root=root)) as fake:
                started = time.monotonic()
                answer = httpx.get(f"{running.url}/probe", params={"target": fake.url}, timeout=10)
                assert time.monotonic() - started < 3
                assert answer.status_code == 200
                answers.append(_model_lines(answer.text, root))
    assert answers[0], "the answer says why there is no prediction"
    for lines in answers[1:]:
        assert set(lines) ^ set(answers[0]) == set()
    assert 'headroom_prediction_state{state="model_not_found"} 1.0' in answers[0]
