"""Specification of polling one vLLM target: views, failures as data, restarts, discovery."""

from __future__ import annotations

import asyncio
import gc
import math
import tracemalloc
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from structlog.testing import capture_logs

from exporter.core.ceiling import QueueCaps
from exporter.core.derive import WindowSettings
from exporter.core.pool import GroupBlocks, PoolLayout
from exporter.core.reasons import Limit
from exporter.core.views import PredictionView, TargetInfo, TargetView
from exporter.service.memory import MemoryBudget
from exporter.service.poller import PollSettings, TargetPoller
from exporter.testing import heavy
from exporter.testing.fakevllm import FakeVllm, Fault, VllmState, render_metrics
from exporter.vllm.client import ModelsInfo, VllmClient
from exporter.vllm.launch import parse_launch_flags
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping, Sequence

    from exporter.core.snapshot import VllmSnapshot
    from exporter.core.views import GpuMemoryView
    from exporter.errors import SourceError
    from exporter.vllm.launch import LaunchFlags

CAPTURES = paths.CAPTURES
AFTER_LOAD = (CAPTURES / "vllm-0.32.0-cpu-after-load.prom").read_bytes()
IDLE = (CAPTURES / "vllm-0.32.0-cpu-idle.prom").read_bytes()


def fake_vllm() -> FakeVllm:
    """The fake vLLM serving the real 0.32 capture, answering through httpx's transport."""
    state = VllmState(model="tiny", root="/models/tiny", max_model_len=512)
    return FakeVllm(state=state, payload=AFTER_LOAD, listen=False)


class Clock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def poll(fake: FakeVllm, clock: Clock, times: int = 1, **kwargs: object) -> TargetPoller:
    """Make a poller over the fake API and poll it ``times``, 5 s apart."""

    async def go() -> TargetPoller:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = VllmClient(
                "http://vllm:8000", client=http, timeout_seconds=2.0, max_bytes=1 << 20
            )
            poller = TargetPoller(
                "http://vllm:8000",
                client=client,
                parse=parse_vllm_metrics,
                clock=clock,
                wall_clock=lambda: 1_800_000_000.0,
                **kwargs,  # type: ignore[arg-type]
            )
            for _ in range(times):
                await poller.poll_once()
                clock.now += 5.0
            return poller

    return asyncio.run(go())


def test_a_successful_poll_publishes_derived_figures_and_target_facts() -> None:
    """The real 0.32 capture gives the 1,024-token pool and the model facts of /v1/models."""
    poller = poll(fake_vllm(), Clock())
    view = poller.view
    assert poller.ready
    assert view.derived is not None
    (engine,) = view.derived.engines
    assert engine.kv_capacity_tokens == 1024
    assert engine.model_name == "tiny"
    assert view.info == TargetInfo("tiny", "/models/tiny", 512, "0.32.0")
    assert view.sources["vllm_metrics"].up
    assert view.sources["vllm_metrics"].last_success_time == 1_800_000_000.0


def test_discovery_runs_once_not_on_every_poll() -> None:
    """/v1/models and /version are read at start, not every few seconds."""
    fake = fake_vllm()
    poll(fake, Clock(), times=3)
    assert fake.counts.requests["/metrics"] == 3
    assert fake.counts.requests["/v1/models"] == 1
    assert fake.counts.requests["/version"] == 1


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (Fault.REFUSE, "connection_refused"),
        (Fault.HTTP_500, "http_5xx"),
        (Fault.HTML, "not_metrics"),
        (Fault.JSON, "not_metrics"),
        (Fault.HUGE, "too_large"),
        (Fault.MALFORMED, "parse_error"),
    ],
)
def test_a_failing_target_becomes_data_not_an_exception(fault: Fault, reason: str) -> None:
    """Each failure marks vllm_metrics down with a bounded reason and publishes no stale figures."""
    fake = fake_vllm()
    fake.set_fault(fault)
    poller = poll(fake, Clock(), times=2)
    health = poller.view.sources["vllm_metrics"]
    assert not health.up
    assert health.errors == {reason: 2}
    assert poller.view.derived is None
    assert not poller.ready


def test_a_failure_is_logged_once_per_change_of_state() -> None:
    """Three refused polls log one warning; the recovery logs one info line."""
    fake = fake_vllm()
    fake.set_fault(Fault.REFUSE)
    clock = Clock()

    async def go() -> None:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = VllmClient("http://v:1", client=http, timeout_seconds=1, max_bytes=1 << 20)
            poller = TargetPoller(
                "http://v:1", client=client, parse=parse_vllm_metrics, clock=clock
            )
            for _ in range(3):
                await poller.poll_once()
            fake.set_fault(Fault.NONE)
            await poller.poll_once()

    with capture_logs() as logs:
        asyncio.run(go())
    events = [(e["event"], e.get("reason")) for e in logs if e["event"].startswith("source_")]
    assert events == [("source_failed", "connection_refused"), ("source_recovered", None)]


def test_a_restart_is_counted_and_triggers_rediscovery() -> None:
    """A new process start time counts a restart and re-reads /v1/models and /version."""
    fake = fake_vllm()
    clock = Clock()
    restarted = AFTER_LOAD.replace(
        b"process_start_time_seconds 1.", b"process_start_time_seconds 2."
    )
    assert restarted != AFTER_LOAD

    async def go() -> TargetPoller:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = VllmClient("http://v:1", client=http, timeout_seconds=1, max_bytes=1 << 20)
            poller = TargetPoller(
                "http://v:1", client=client, parse=parse_vllm_metrics, clock=clock
            )
            await poller.poll_once()
            clock.now += 5
            fake.payload = restarted
            await poller.poll_once()
            return poller

    poller = asyncio.run(go())
    assert poller.view.restarts_total == 1
    assert fake.counts.requests["/v1/models"] == 2


@pytest.mark.parametrize("model", ["tiny", "other"], ids=["same-model", "another-model"])
def test_a_restart_as_another_model_starts_the_window_again(model: str) -> None:
    """Another model after a restart: the window's traffic was the other model's, forgotten.

    The p95 context the headroom is counted in would otherwise be the previous model's for up
    to an hour. A restart as the same model keeps the window (the same application's traffic).
    """
    fake = FakeVllm(
        state=VllmState(model="tiny", root="/models/tiny", max_model_len=512), listen=False
    )
    clock = Clock()

    async def go() -> tuple[TargetPoller, list[MutableMapping[str, Any]]]:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = VllmClient("http://v:1", client=http, timeout_seconds=1, max_bytes=1 << 20)
            poller = TargetPoller(
                "http://v:1", client=client, parse=parse_vllm_metrics, clock=clock
            )
            for _ in range(4):
                await poller.poll_once()
                clock.now += 5
            fake.restart(model=model)
            with capture_logs() as logs:
                await poller.poll_once()
            return poller, logs

    poller, logs = asyncio.run(go())
    changed = [e for e in logs if e["event"] == "target_model_changed"]
    if model == "other":
        assert poller.view.window_samples == 1
        assert [(e["model"], e["previous_model"]) for e in changed] == [("other", "tiny")]
    else:
        assert poller.view.window_samples == 5
        assert changed == []


def test_recovery_after_an_outage_rereads_the_target_facts() -> None:
    """vLLM may come back as another model: discovery runs again after an outage."""
    fake = fake_vllm()
    clock = Clock()

    async def go() -> None:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = VllmClient("http://v:1", client=http, timeout_seconds=1, max_bytes=1 << 20)
            poller = TargetPoller(
                "http://v:1", client=client, parse=parse_vllm_metrics, clock=clock
            )
            await poller.poll_once()
            fake.set_fault(Fault.REFUSE)
            await poller.poll_once()
            fake.set_fault(Fault.NONE)
            await poller.poll_once()

    asyncio.run(go())
    assert fake.counts.requests["/v1/models"] == 2


def test_a_snapshot_is_counted_in_the_memory_budget_while_discovery_waits() -> None:
    """The parsed snapshot joins the window (and the process's budget) before discovery awaits.

    Fleet mode has dozens of polls in flight: a snapshot held uncounted while /v1/models is
    slow would escape the one memory bound of the process.
    """
    fake = fake_vllm()
    budget = MemoryBudget(limit_bytes=64 << 20)
    seen_during_discovery: list[int] = []

    class SlowModels(VllmClient):
        async def fetch_models(self) -> ModelsInfo:
            seen_during_discovery.append(budget.used_bytes)
            return await super().fetch_models()

    async def go() -> None:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = SlowModels("http://v:1", client=http, timeout_seconds=1, max_bytes=1 << 20)
            poller = TargetPoller(
                "http://v:1",
                client=client,
                parse=parse_vllm_metrics,
                clock=Clock(),
                memory=budget,
            )
            await poller.poll_once()

    asyncio.run(go())
    assert seen_during_discovery
    assert seen_during_discovery[0] > 0


def _pollers(
    payload: Callable[[int], bytes], count: int, polls: int, *, hold: bool
) -> tuple[list[TargetPoller], list[TargetView], MemoryBudget]:
    """``count`` pollers of one fake serving ``payload``, polled ``polls`` times, 5 s apart.

    Their budget, and the views the last polls returned.
    """
    fake = FakeVllm(payload=payload, listen=False)
    budget = MemoryBudget(limit_bytes=1 << 30)
    clock = Clock()
    settings = PollSettings(hold_figures=hold)

    async def go() -> tuple[list[TargetPoller], list[TargetView]]:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            pollers = [
                TargetPoller(
                    f"http://v{i}:8000",
                    client=VllmClient(
                        f"http://v{i}:8000", client=http, timeout_seconds=5, max_bytes=1 << 24
                    ),
                    parse=parse_vllm_metrics,
                    settings=settings,
                    memory=budget,
                    clock=clock,
                )
                for i in range(count)
            ]
            views = []
            for poller in pollers:
                for _ in range(polls):
                    view = await poller.poll_once()
                    clock.now += 5.0
                views.append(view)
            return pollers, views

    pollers, views = asyncio.run(go())
    return pollers, views, budget


def _busy(scrape: int) -> bytes:
    """Four engines, 500 requests finished a poll: context figures that stand."""
    return render_metrics(VllmState(engines=4, finished=12 + 500 * scrape))


def test_fleet_mode_holds_no_figures_between_polls_and_derives_the_same() -> None:
    """The probe's answer has every figure; the poller keeps only what the next poll reads.

    Busy engines whose context figures stand: each poll's figures equal a sidecar's.
    """
    for polls in (1, 3, 9):
        (fleet,), (answer,), _ = _pollers(_busy, 1, polls, hold=False)
        (sidecar,), (held,), _ = _pollers(_busy, 1, polls, hold=True)
        assert answer.derived is not None
        assert answer.derived == held.derived == sidecar.view.derived
        assert fleet.view.derived is None
        assert fleet.view.up


@pytest.mark.parametrize("hold", [False, True], ids=["fleet", "sidecar"])
@pytest.mark.parametrize(
    "payload",
    [
        heavy.long_split_labels(engines=8).payload,
        lambda scrape: render_metrics(VllmState(engines=16, finished=12 + 2 * scrape)),
        _busy,
    ],
    ids=["long_split_labels_8", "healthy_16", "busy_4"],
)
def test_what_a_poller_holds_besides_its_samples_is_counted_near_what_it_is(
    payload: Callable[[int], bytes], hold: bool
) -> None:
    """The budget counts each poller's state, within -20 % and +50 % of tracemalloc's figure.

    Three pollers after three polls, their windows emptied: what stays is their state.
    """
    # The imports and caches such polls fill (patterns compiled, loggers bound, first-time log
    # lines) are not the pollers': the same polls once before, so that the process holds them.
    _pollers(payload, 3, 3, hold=hold)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pollers, views, budget = _pollers(payload, 3, 3, hold=hold)
        del views
        samples = sum(poller._window.bytes for poller in pollers)
        assert budget.used_bytes > samples
        for poller in pollers:
            poller._window.clear()
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.8 * traced <= budget.used_bytes <= 1.5 * traced


def test_the_window_keeps_one_sample_older_than_the_longest_window() -> None:
    """Samples older than the windows are dropped, keeping one baseline before them."""
    fixed = PollSettings(windows=WindowSettings(context_seconds=600.0, context_min_requests=0))
    poller = poll(fake_vllm(), Clock(), times=200, settings=fixed)  # 1000 s of polls
    # 121 samples within [now - 600 s, now] at a 5 s cadence, and the baseline before them.
    assert poller.view.window_samples == 600 // 5 + 1 + 1


def test_the_window_keeps_the_samples_the_context_window_may_reach_back_for() -> None:
    """Samples within context_max_seconds stay, for the context window's reach."""
    reach = WindowSettings(context_seconds=600.0, context_max_seconds=900.0)
    poller = poll(fake_vllm(), Clock(), times=300, settings=PollSettings(windows=reach))
    assert poller.view.window_samples == 900 // 5 + 1 + 1


def test_the_reach_back_costs_no_resolution_where_samples_are_scarce() -> None:
    """Where the sample count binds (fleet mode), the windows keep their resolution.

    Samples stay one poll apart over the windows and the reach gets what the count leaves,
    not a window thinned to span the reach.
    """
    reach = WindowSettings(context_seconds=600.0, context_max_seconds=3600.0)
    scarce = PollSettings(windows=reach, max_engine_samples=130)
    poller = poll(fake_vllm(), Clock(), times=300, settings=scarce)
    assert poller.view.window_samples == 130  # 645 s of 5 s polls: the window and a little


class StubPredictor:
    """A predictor that records its calls and predicts a fixed capacity."""

    def __init__(self) -> None:
        self.loaded: list[TargetInfo] = []

    def load(self, info: TargetInfo) -> SourceError | None:
        self.loaded.append(info)
        return None

    def predict(
        self,
        snapshot: VllmSnapshot,
        info: TargetInfo,
        gpus: Sequence[GpuMemoryView],
        flags: LaunchFlags | None = None,
    ) -> PredictionView:
        return PredictionView(state="ok", capacity_tokens=1024.0, bytes_per_token=1024.0)


def test_the_predictor_loads_after_discovery_and_feeds_the_derivation() -> None:
    """The model is loaded with the discovered root; its capacity becomes the predicted gauge."""
    predictor = StubPredictor()
    poller = poll(fake_vllm(), Clock(), predictor=predictor)
    assert [i.model_root for i in predictor.loaded] == ["/models/tiny"]
    assert poller.view.derived is not None
    assert poller.view.derived.engines[0].kv_capacity_error_ratio == 0.0
    assert poller.view.sources["model_config"].up


#: The real Qwen3-Next's pool (tests/fixtures/vllm-cpu/architectures/qwen3-next): 32 blocks of
#: 256 tokens in a full-attention group and a state group, 5.33 max-length requests at once.
_HYBRID_CACHE = (
    'vllm:cache_config_info{block_size="256",engine="0",num_gpu_blocks="32",'
    'kv_cache_size_tokens="5461",kv_cache_max_concurrency="5.333333333333333"} 1.0'
)


def _hybrid_vllm() -> FakeVllm:
    """The real 0.32 capture with the cache config of a hybrid pool, served at 1,024 tokens."""
    lines = [
        _HYBRID_CACHE if line.startswith("vllm:cache_config_info{") else line
        for line in AFTER_LOAD.decode().splitlines()
    ]
    state = VllmState(model="tiny", root="/models/tiny", max_model_len=1024)
    return FakeVllm(state=state, payload=("\n".join(lines) + "\n").encode(), listen=False)


class LayoutPredictor(StubPredictor):
    """Predicts the hybrid pool's layout; records the command-line flags it was given."""

    def __init__(self, layout: PoolLayout | None) -> None:
        super().__init__()
        self.layout = layout
        self.flags: list[LaunchFlags | None] = []

    def predict(
        self,
        snapshot: VllmSnapshot,
        info: TargetInfo,
        gpus: Sequence[GpuMemoryView],
        flags: LaunchFlags | None = None,
    ) -> PredictionView:
        self.flags.append(flags)
        return PredictionView(state="ok", capacity_tokens=5461.0, layout=self.layout)


@pytest.mark.parametrize("known", [True, False], ids=["groups-known", "groups-unknown"])
def test_the_predictions_kv_groups_count_a_hybrid_pools_sequences(known: bool) -> None:
    """The prediction's groups reach the derivation: a hybrid's p95 ceiling in blocks, or absent.

    A full-attention group of 256-token blocks and a state group of two: 3 blocks a sequence of
    up to 256 tokens, 6 at 1,024 (vLLM's 32 / 5.33). The command line's flags reach the
    predictor (its --max-num-batched-tokens sizes a window's blocks).
    """
    layout = PoolLayout(
        groups=(GroupBlocks("full", None, 256), GroupBlocks("state", None, 256, max_blocks=2)),
        max_model_len=1024,
        max_len_blocks=6,
    )
    predictor = LayoutPredictor(layout if known else None)
    launch = Launch(["vllm", "serve", "/models/tiny", "--max-num-batched-tokens", "128"])
    poller = poll(_hybrid_vllm(), Clock(), times=2, predictor=predictor, launch=launch)
    assert poller.view.derived is not None
    (engine,) = poller.view.derived.engines
    assert engine.context_p95_tokens is not None
    if known:
        per_sequence = layout.blocks_per_sequence(math.ceil(engine.context_p95_tokens))
        assert engine.p95_kv_ceiling_sequences == 31 // per_sequence
    else:
        assert engine.p95_kv_ceiling_sequences is None
    assert [f.max_num_batched_tokens for f in predictor.flags if f is not None][-1] == 128


# --- max_num_seqs: learnt from the vLLM process, else the setting, else the default ----------


class Launch:
    """A LaunchSource answering a fixed command line, counting its reads."""

    def __init__(self, argv: list[str] | None) -> None:
        self.argv = argv
        self.reads = 0

    def read(self) -> LaunchFlags | None:
        self.reads += 1
        return parse_launch_flags(self.argv) if self.argv is not None else None


def test_max_num_seqs_is_learnt_from_the_vllm_command_line() -> None:
    """vLLM started with --max-num-seqs 2: the engine's limit is 2, from its command line."""
    launch = Launch(["vllm", "serve", "/models/tiny", "--max-num-seqs", "2"])
    with capture_logs() as logs:
        poller = poll(fake_vllm(), Clock(), times=2, launch=launch)
    assert poller.view.derived is not None
    (engine,) = poller.view.derived.engines
    assert engine.max_num_seqs_by_source == {"command_line": 2.0}
    assert launch.reads == 1, "read at discovery, not on every poll"
    learnt = [e for e in logs if e["event"] == "max_num_seqs"]
    assert len(learnt) == 1, "logged when it changes, not every poll"
    assert learnt[0]["origin"] == "command_line"


def test_without_the_flag_the_setting_then_the_default() -> None:
    """No flag on the command line: the max_num_seqs setting; without it vLLM's CPU default."""
    bare = Launch(["vllm", "serve", "/models/tiny"])
    set_ = poll(fake_vllm(), Clock(), launch=bare, settings=PollSettings(max_num_seqs=7))
    assert set_.view.derived is not None
    assert set_.view.derived.engines[0].max_num_seqs_by_source == {"setting": 7.0}
    default = poll(fake_vllm(), Clock(), launch=Launch(None))
    assert default.view.derived is not None
    # The capture is vLLM 0.32's CPU backend (128-token blocks, no GPU): 128 x 1.
    assert default.view.derived.engines[0].max_num_seqs_by_source == {"default": 128.0}


def test_the_queue_cap_settings_count_where_the_command_line_is_silent() -> None:
    """The queue cap settings count where vLLM's command line does not say them.

    No --max-num-queued-reqs to read (fleet mode): the setting's cap of 1, with nothing in
    flight, leaves room for 1 and binds (the pool holds 1 p95 sequence too; the cap is named);
    the flag, where the command line has one, wins: 1,000 leave the pool binding.
    """
    caps = PollSettings(queue_caps=QueueCaps(requests=1, tokens=100_000))
    capped = poll(fake_vllm(), Clock(), launch=Launch(None), settings=caps)
    assert capped.view.derived is not None
    (engine,) = capped.view.derived.engines
    assert (engine.p95_available_sequences, engine.p95_available_limit) == (1.0, Limit.QUEUE_CAP)
    flag = Launch(["vllm", "serve", "m", "--max-num-queued-reqs", "1000"])
    over = poll(fake_vllm(), Clock(), launch=flag, settings=caps)
    assert over.view.derived is not None
    assert over.view.derived.engines[0].p95_available_limit != Limit.QUEUE_CAP
    unset = poll(fake_vllm(), Clock(), launch=Launch(None))
    assert unset.view.derived is not None
    assert unset.view.derived.engines[0].p95_available_limit != Limit.QUEUE_CAP


def test_a_restarted_vllm_has_its_command_line_read_again() -> None:
    """After a restart the flags may differ: discovery reads them again."""
    fake = fake_vllm()
    launch = Launch(["vllm", "serve", "m", "--max-num-seqs", "2"])
    clock = Clock()

    async def go() -> None:
        async with httpx.AsyncClient(transport=fake.transport()) as http:
            client = VllmClient(
                "http://vllm:8000", client=http, timeout_seconds=2.0, max_bytes=1 << 20
            )
            poller = TargetPoller(
                "http://vllm:8000",
                client=client,
                parse=parse_vllm_metrics,
                clock=clock,
                launch=launch,
            )
            await poller.poll_once()
            launch.argv = ["vllm", "serve", "m", "--max-num-seqs", "16"]
            fake.payload = AFTER_LOAD.replace(  # a new process start time: a restart
                b"process_start_time_seconds 1.", b"process_start_time_seconds 2."
            )
            clock.now += 5.0
            await poller.poll_once()
            assert poller.view.derived is not None
            assert poller.view.derived.engines[0].max_num_seqs_by_source == {"command_line": 16.0}

    asyncio.run(go())
    assert launch.reads == 2


def test_a_crashing_launch_source_is_logged_and_the_default_used() -> None:
    """An odd /proc must not stop the polls: the crash is logged, the default stands in."""

    class Broken:
        def read(self) -> LaunchFlags | None:
            raise RuntimeError("boom")

    with capture_logs() as logs:
        poller = poll(fake_vllm(), Clock(), launch=Broken())
    assert poller.view.derived is not None
    assert poller.view.derived.engines[0].max_num_seqs_by_source == {"default": 128.0}
    assert any(e["event"] == "launch_read_crashed" for e in logs)


def test_invalid_flags_are_warned_about() -> None:
    """--max-num-seqs=abc on vLLM's command line: a warning naming it; the default is used."""
    with capture_logs() as logs:
        poll(fake_vllm(), Clock(), launch=Launch(["vllm", "serve", "m", "--max-num-seqs=abc"]))
    warned = [e for e in logs if e["event"] == "launch_flags_invalid"]
    assert warned
    assert warned[0]["flags"] == {"--max-num-seqs": "abc"}


@pytest.mark.parametrize("error", [OverflowError, RecursionError, ValueError])
def test_a_poll_crashing_after_metrics_logs_one_failure_not_a_recovery_per_poll(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    """/metrics answers, the derivation crashes: one source_failed, never source_recovered."""

    def crash(*_args: object, **_kwargs: object) -> None:
        raise error("boom")

    monkeypatch.setattr("exporter.service.poller.derive_target", crash)
    with capture_logs() as logs:
        poller = poll(fake_vllm(), Clock(), times=4)
    events = [(e["event"], e.get("reason")) for e in logs if e["event"].startswith("source_")]
    assert events == [("source_failed", "internal_error")]
    assert poller.view.sources["vllm_metrics"].errors == {"internal_error": 4}
    assert not poller.view.sources["vllm_metrics"].up


@pytest.mark.parametrize(
    ("state", "info"),
    [
        (VllmState(root="/r" * 300), TargetInfo("tiny", None, 512, "0.32.0")),
        (VllmState(model="m" * 513), TargetInfo(None, None, None, "0.32.0")),
        (VllmState(version="0" * 100_000), TargetInfo("tiny", "/models/tiny", 512, None)),
    ],
    ids=["long-root", "long-id", "long-version"],
)
def test_facts_past_the_cap_are_not_kept_and_the_rest_is(
    state: VllmState, info: TargetInfo
) -> None:
    """A 600-character root, a 513-character id, a 100 kB version: absent, the poll goes on."""
    fake = FakeVllm(state=state, payload=AFTER_LOAD, listen=False)
    with capture_logs() as logs:
        poller = poll(fake, Clock(), times=2)
    assert poller.view.info == info
    assert poller.view.derived is not None
    assert poller.view.sources["vllm_metrics"].up
    if info.model_root is None and info.model_id is not None:
        assert [e["event"] for e in logs if e["event"] == "models_fields_ignored"]


def test_counters_a_hair_lower_under_the_same_start_time_keep_the_target_up() -> None:
    """Float noise in a counter (multiprocess prometheus_client) is no inconsistent target.

    vLLM's real capture, then the same payload with its preemptions 15 read as 14.999999999:
    the target stays up with its window and figures, no restart is counted, and the
    preemption rate stays 0 (not the lifetime's 15 again). Before, the target was refused as
    inconsistent for 60 s and its window emptied.
    """
    lower = AFTER_LOAD.replace(
        b'vllm:num_preemptions_total{engine="0",model_name="tiny"} 15.0',
        b'vllm:num_preemptions_total{engine="0",model_name="tiny"} 14.999999999',
    )
    assert lower != AFTER_LOAD
    fake = fake_vllm()
    fake.payload = lambda served: lower if served == 1 else AFTER_LOAD
    poller = poll(fake, Clock(), times=3)
    view = poller.view
    assert view.up
    assert view.restarts_total == 0
    assert view.window_samples == 3
    assert view.derived is not None
    # 15 -> 14.999999999 -> 15 over 10 s: the noise, never the lifetime's 15 / 5 s.
    assert view.derived.engines[0].preemptions_per_second == pytest.approx(0.0, abs=1e-9)


def test_counters_creeping_down_by_noise_never_count_their_lifetime_as_new() -> None:
    """Noise that adds up across the polls a kept sample stands for is a decrease all the same.

    Each poll reads the preemptions a hair lower than the one before (within float noise, so
    no restart between two polls), while the window keeps one sample per 300 s: the newest
    sample replaces the one before it, and the kept pair is lower by more than noise. That is
    a restart between the kept samples (checked against the ceiling of what one process could
    count, as every restart is), never the lifetime's 15 counted again as 15 / 10 s.
    """
    step = 15.0 * 0.9e-9  # within went_down's noise for one poll, past it over two
    served: list[int] = []

    def creeping(index: int) -> bytes:
        served.append(index)
        value = 15.0 - step * index
        return AFTER_LOAD.replace(
            b'vllm:num_preemptions_total{engine="0",model_name="tiny"} 15.0',
            f'vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {value!r}'.encode(),
        )

    fake = fake_vllm()
    fake.payload = creeping
    # one engine, 2 samples: a spacing of 300 s, so every later poll replaces the latest
    poller = poll(fake, Clock(), times=4, settings=PollSettings(max_engine_samples=2))
    view = poller.view
    assert len(set(served)) == 4
    assert view.up
    assert view.window_samples == 2
    assert view.derived is not None
    assert view.derived.engines[0].preemptions_per_second == pytest.approx(0.0, abs=1e-6)


def test_a_counter_past_any_vllms_never_makes_an_infinite_rate() -> None:
    """Readings of 1.7e308 a reset apart (the series missing between) would add up to inf.

    A counter past 2**53 is no vLLM's: the parser leaves it out (``out_of_range``), so the
    preemption rate is never +Inf, which an alert on it would take for real preemptions.
    """
    line = b'vllm:num_preemptions_total{engine="0",model_name="tiny"} 15.0'
    payloads = [
        AFTER_LOAD.replace(line, line.replace(b"15.0", b"0.0")),
        AFTER_LOAD.replace(line, line.replace(b"15.0", b"1.7e308")),
        AFTER_LOAD.replace(line + b"\n", b""),
        AFTER_LOAD.replace(line, line.replace(b"15.0", b"0.0")),
        AFTER_LOAD.replace(line, line.replace(b"15.0", b"1.7e308")),
    ]
    assert all(p != AFTER_LOAD for p in payloads)
    fake = fake_vllm()
    fake.payload = lambda served: payloads[min(served, len(payloads) - 1)]
    poller = poll(fake, Clock(), times=len(payloads))
    view = poller.view
    assert view.derived is not None
    rate = view.derived.engines[0].preemptions_per_second
    assert rate is None or math.isfinite(rate)
