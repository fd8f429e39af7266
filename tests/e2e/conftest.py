"""Fixtures for the end-to-end tests: a real vLLM and a Prometheus factory (tools: tests/tools.py).

Every test under ``tests/e2e/`` is marked ``e2e`` here (``pytest -m "not e2e"`` skips them).

When a tool is missing: with ``CI`` set to true the fixture FAILS, naming the tool and the command
that installs it (a CI run must never pass by skipping its end-to-end tests); on a developer
machine it skips with the same message. ``make deps`` installs everything.

Servers are session-scoped (vLLM takes about a minute to start on two CPU cores) and are always
stopped at the end of the session, whether tests pass, fail or are interrupted; SIGTERM (a CI
timeout) is turned into KeyboardInterrupt so that teardown still runs.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from tests.e2e import lanes
from tests.e2e.harness import (
    REFERENCE_KV_CACHE_MEMORY_BYTES,
    REFERENCE_MAX_MODEL_LEN,
    PrometheusServer,
    ScrapeJob,
    VllmServer,
    prometheus_binary,
    tiny_model,
    vllm_venv,
)
from tests.tools import require

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

E2E_DIR = Path(__file__).resolve().parent


def _interrupt_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """Let a SIGTERM (CI timeout, ``kill``) unwind through fixture teardown like Ctrl-C does."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Release the other lane, whatever happened in this one (tests/e2e/lanes.py)."""
    lanes.beside_lane_done()
    lanes.main_lane_quiet()


#: Fixtures that put load on both cores: a vLLM (the shared one or a test's own) or the image.
CORE_FIXTURES = frozenset({"vllm_server", "vllm_factory", "image"})


def _takes_the_cores(item: pytest.Item) -> bool:
    return not CORE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


#: Module flags of the scenarios that wait for the other lanes themselves, just before their
#: burst (their modules say why), in the order they run.
WAITS_FOR_THE_UNIT_TESTS = "WAITS_FOR_THE_UNIT_TESTS"
WAITS_FOR_THE_BESIDE_LANE = "WAITS_FOR_THE_BESIDE_LANE"


def _waits_itself(item: pytest.Item, what: str) -> bool:
    """Whether the test's module waits for ``what`` itself, just before its burst."""
    return bool(getattr(getattr(item, "module", None), what, False))


def _lane_order(item: pytest.Item) -> int:
    """Tests without a vLLM first; then the scenarios that wait themselves, in the order they wait.

    The alerting scenario (``WAITS_FOR_THE_UNIT_TESTS``) is the main lane's first burst; the
    sidecar scenario (``WAITS_FOR_THE_BESIDE_LANE``) spends its idle half-minute while the beside
    lane's last burst ends; then the rest.
    """
    if not _takes_the_cores(item):
        return 0
    if _waits_itself(item, WAITS_FOR_THE_UNIT_TESTS):
        return 1
    if _waits_itself(item, WAITS_FOR_THE_BESIDE_LANE):
        return 2
    return 3


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """In either lane, a test that loads the cores starts once the other lane lets it.

    Before any of its fixtures (tests/e2e/lanes.py): once the unit tests have ended; in the
    beside lane, once the main lane's burst is over; in the main lane, once the beside lane has
    ended, if the main lane let it start. Except in a module whose scenario waits itself, just
    before its burst: the alerting scenario starts its servers and spends its idle minute while
    the unit tests run (``WAITS_FOR_THE_UNIT_TESTS``; its later tests, which read the record,
    wait for nothing), the sidecar scenario while the beside lane ends
    (``WAITS_FOR_THE_BESIDE_LANE``).
    """
    for wait in holds(item):
        wait()


def holds(item: pytest.Item) -> list[Callable[[], None]]:
    """The lanes' waits before a test's fixtures, in order (see ``pytest_runtest_setup``).

    None for a test of the alerting scenario's module: its scenario runs in its first test's
    fixture and only then lets the beside lane start; its other tests read the record. Held
    until the beside lane ends, they would hold the sidecar scenario's idle half-minute too.
    """
    if not _takes_the_cores(item) or _waits_itself(item, WAITS_FOR_THE_UNIT_TESTS):
        return []
    waits = [lanes.wait_for_unit_tests]
    if not _waits_itself(item, WAITS_FOR_THE_BESIDE_LANE):
        waits.append(lanes.wait_for_beside_lane)
    return [*waits, lanes.wait_for_quiet]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test collected under tests/e2e/ with ``e2e``.

    In scripts/test.sh's lanes, which start beside the unit tests, the tests that start no vLLM
    and build no image run first (in their order), while the unit tests still run.
    """
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    if lanes.LANE:
        items.sort(key=_lane_order)


@pytest.fixture(scope="session")
def e2e_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the servers' logs of this session."""
    return tmp_path_factory.mktemp("e2e-logs")


@pytest.fixture(scope="session")
def vllm_venv_path() -> Path:
    """The cached vLLM CPU venv (fails in CI / skips locally when absent)."""
    return require(vllm_venv)


@pytest.fixture(scope="session")
def tiny_llama(vllm_venv_path: Path) -> Path:
    """The reference tiny Llama's directory (1,024 KV bytes per token), built once and cached."""
    return tiny_model("llama")


#: Numbers the extra servers of the whole session, so that each module's get their own logs.
_SERVER_NUMBERS = itertools.count()


@pytest.fixture(scope="module")
def vllm_factory(vllm_venv_path: Path, e2e_logs: Path) -> Iterator[Callable[..., VllmServer]]:
    """Start extra vLLM servers: ``vllm_factory(model_dir, **VllmServer kwargs)``, started.

    Each gets its own log in the session's log directory; all are stopped when the module that
    started them ends (a test may stop one earlier): an idle vLLM's engine still busy-polls,
    and two left running took most of a core from every later test.
    """
    servers: list[VllmServer] = []

    def start(model_dir: Path, **kwargs: Any) -> VllmServer:
        kwargs.setdefault("log_path", e2e_logs / f"vllm-{next(_SERVER_NUMBERS)}.log")
        server = VllmServer(model_dir, **kwargs)
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_llama: Path, e2e_logs: Path) -> Iterator[VllmServer]:
    """vLLM serving the reference tiny Llama as ``tiny``: 1 MiB KV pool = 1,024 tokens, 8 blocks.

    Shared by the session: tests must not assume an idle server or zeroed counters (read values
    before and after), and a test that stops or restarts it must leave it running.
    """
    with VllmServer(
        tiny_llama,
        kv_cache_memory_bytes=REFERENCE_KV_CACHE_MEMORY_BYTES,
        max_model_len=REFERENCE_MAX_MODEL_LEN,
        log_path=e2e_logs / "vllm-reference.log",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus_factory(
    e2e_logs: Path,
) -> Iterator[Callable[..., PrometheusServer]]:
    """Start Prometheus servers: ``prometheus_factory(jobs, rule_files=..., ...)``, started.

    Each gets a fresh work directory (config, TSDB, log); all are stopped when the module that
    started them ends (each evaluates the whole rule set every few seconds).
    """
    require(prometheus_binary)
    servers: list[PrometheusServer] = []

    def start(jobs: Sequence[ScrapeJob], **kwargs: Any) -> PrometheusServer:
        kwargs.setdefault("workdir", e2e_logs / f"prometheus-{next(_SERVER_NUMBERS)}")
        server = PrometheusServer(jobs, **kwargs)
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
