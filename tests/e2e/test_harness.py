"""Smoke tests of the e2e harness: real vLLM, Prometheus, promtool and Helm behave as it promises.

The later end-to-end tests (sidecar, alerts, chart) stand on these facts: the reference vLLM
reports the 1,024-token pool, a burst of 8 x 480-token requests preempts, Prometheus scrapes vLLM
and loads rule files, and no process the harness starts outlives it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exporter.testing.processes import wait_until
from tests.e2e.harness import (
    NICED,
    REFERENCE_MAX_MODEL_LEN,
    REFERENCE_MODEL_NAME,
    VLLM_VERSION,
    BackgroundBurst,
    ProcessGroup,
    PrometheusServer,
    ScrapeJob,
    ServerStartError,
    VllmServer,
    burst,
    cache_config_labels,
    process_group_gone,
    sample_value,
)

if TYPE_CHECKING:
    from collections.abc import Callable

#: 8 concurrent requests of 128 prompt + 352 output = 480 tokens each (4 blocks of 128 at the
#: end) cannot all fit the 7 usable blocks of the 1,024-token pool: vLLM must preempt.
BURST = {"concurrency": 8, "prompt_tokens": 128, "output_tokens": 352}

GOOD_RULES = """\
groups:
  - name: e2e-smoke
    interval: 1s
    rules:
      - record: e2e:vllm_preemptions:rate1m
        expr: sum by (job, instance) (rate(vllm:num_preemptions_total[1m]))
      - alert: E2eVllmCacheConfigSeen
        expr: vllm:cache_config_info == 1
        labels:
          severity: info
        annotations:
          summary: vLLM exposes its cache config
"""

BROKEN_RULES = """\
groups:
  - name: e2e-broken
    rules:
      - record: e2e:broken
        expr: rate(vllm:num_preemptions_total[1m]
"""


# ------------------------------------------------------------------------------------- vLLM


def test_vllm_reports_the_reference_kv_pool(vllm_server: VllmServer) -> None:
    """The reference tiny Llama in a 1 MiB pool is 8 blocks of 128 tokens, 1,024 tokens."""
    [labels] = cache_config_labels(vllm_server.metrics_text())
    assert labels["num_gpu_blocks"] == "8"
    assert labels["block_size"] == "128"
    assert labels["kv_cache_size_tokens"] == "1024"
    assert labels["kv_cache_memory_bytes"] == "1048576"


def test_vllm_answers_models_and_version(vllm_server: VllmServer) -> None:
    """/v1/models names the served model and its max_model_len; /version the pinned vLLM."""
    [model] = vllm_server.get_json("/v1/models")["data"]
    assert model["id"] == REFERENCE_MODEL_NAME
    assert model["root"] == str(vllm_server.model_dir)
    assert model["max_model_len"] == REFERENCE_MAX_MODEL_LEN
    assert vllm_server.get_json("/version") == {"version": VLLM_VERSION}


def test_vllm_runs_niced_as_a_whole_session(vllm_server: VllmServer) -> None:
    """The API server is the group's leader, at the harness's niceness, and so is its session.

    The scenarios depend on it: a vLLM niced alone starved every other session on 2 cores.
    """
    pid = vllm_server.pid
    assert pid is not None
    assert Path(f"/proc/{pid}/comm").read_text().strip() != "bash"  # scripts/niced exec'd it
    assert os.getpriority(os.PRIO_PROCESS, pid) == vllm_server.niceness == 10
    assert _session(pid) == pid
    assert _autogroup_niceness(pid) in (None, vllm_server.niceness)


def _session(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def _autogroup_niceness(pid: int) -> int | None:
    """The niceness of ``pid``'s session (``/autogroup-N nice K``).

    None without autogroups, or in the root group, whose file reads empty: init's session, never
    setsid, where CI's pytest runs.
    """
    path = Path(f"/proc/{pid}/autogroup")
    words = path.read_text().split() if path.exists() else []
    return int(words[-1]) if words else None


def test_burst_sends_exact_lengths_and_preempts(vllm_server: VllmServer) -> None:
    """8 concurrent 480-token requests overflow the pool: preemptions rise, usage is exact."""
    before = sample_value(vllm_server.metrics_text(), "vllm:num_preemptions_total")
    done = burst(vllm_server.base_url, REFERENCE_MODEL_NAME, count=8, **BURST)
    after = sample_value(vllm_server.metrics_text(), "vllm:num_preemptions_total")
    assert [(c.index, c.prompt_tokens, c.output_tokens) for c in done] == [
        (i, BURST["prompt_tokens"], BURST["output_tokens"]) for i in range(8)
    ]
    assert before is not None
    assert after is not None
    assert after > before


def test_background_burst_is_visible_in_metrics_while_it_runs(vllm_server: VllmServer) -> None:
    """While a background burst runs, vLLM reports running requests and KV blocks in use.

    Its prompts are not the burst's before (another seed): identical prompts hit vLLM's prefix
    cache and finished before any scrape saw them running (a CI-style run: 16 requests done in
    seconds, the wait timing out after). A burst that still ends unseen is sent again, up to
    three times; one that fails raises its own error.
    """
    seen: list[float] = []

    def busy_or_done(load: BackgroundBurst) -> bool:
        text = vllm_server.metrics_text()
        running = sample_value(text, "vllm:num_requests_running")
        usage = sample_value(text, "vllm:kv_cache_usage_perc")
        if running and usage:
            seen.append(usage)
            return True
        if load.done():
            load.result()  # raises the burst's error, if it failed
            return True  # done before it was seen: send it again
        return False

    # A count, not a duration: on two busy cores a client thread may start its first request
    # seconds late, so a short duration would not prove that every request completes.
    requests = 2 * BURST["concurrency"]
    for seed in (1, 2, 3):
        with BackgroundBurst(
            vllm_server.base_url, REFERENCE_MODEL_NAME, count=requests, seed=seed, **BURST
        ) as load:
            wait_until(
                lambda: busy_or_done(load),
                timeout_s=60.0,
                what="requests running in vLLM",
                interval_s=0.1,
            )
            done = load.result(timeout_s=120.0)
        assert [c.index for c in done] == list(range(requests))
        assert all(c.finished_monotonic > c.started_monotonic for c in done)
        if seen:
            break
    assert seen, "none of three bursts was seen running"
    assert 0.0 < seen[0] <= 1.0


def test_burst_needs_exactly_one_of_count_and_duration() -> None:
    """burst() refuses to guess how long to run when given neither or both bounds."""
    with pytest.raises(ValueError, match="exactly one of duration_s and count"):
        burst("http://127.0.0.1:9", "m", concurrency=1, prompt_tokens=1, output_tokens=1)
    with pytest.raises(ValueError, match="exactly one of duration_s and count"):
        burst(
            "http://127.0.0.1:9",
            "m",
            concurrency=1,
            prompt_tokens=1,
            output_tokens=1,
            count=1,
            duration_s=1.0,
        )


def test_vllm_that_cannot_start_raises_with_its_log(
    tmp_path: Path, vllm_factory: Callable[..., VllmServer]
) -> None:
    """A vLLM that exits during start-up raises ServerStartError naming its log and root cause."""
    log = tmp_path / "vllm.log"
    with pytest.raises(ServerStartError, match="vLLM exited during start-up") as failure:
        vllm_factory(tmp_path / "no-such-model", log_path=log)
    assert str(log) in str(failure.value)
    assert "no-such-model" in str(failure.value)


# ------------------------------------------------------------------------------- Prometheus


def test_prometheus_scrapes_vllm_and_evaluates_rules(
    vllm_server: VllmServer,
    prometheus_factory: Callable[..., PrometheusServer],
    tmp_path: Path,
) -> None:
    """Prometheus scrapes vLLM every second, loads a rule file, records and fires from it."""
    rules = tmp_path / "smoke.rules.yml"
    rules.write_text(GOOD_RULES)
    prometheus = prometheus_factory(
        [ScrapeJob("vllm", [vllm_server.metrics_url])], rule_files=[rules]
    )

    [target] = prometheus.wait_for_targets_up("vllm")
    assert target["scrapeUrl"] == vllm_server.metrics_url
    [series] = prometheus.query('vllm:cache_config_info{job="vllm"}')
    assert series["metric"]["kv_cache_size_tokens"] == "1024"

    [group] = prometheus.rules()
    assert group["file"] == str(rules.resolve())
    evaluated = wait_until(
        lambda: [r for r in prometheus.rules()[0]["rules"] if r["health"] == "ok"],
        timeout_s=20.0,
        what="both smoke rules evaluated",
    )
    assert len(evaluated) == 2
    firing = wait_until(
        lambda: [a for a in prometheus.alerts() if a["state"] == "firing"],
        timeout_s=20.0,
        what="E2eVllmCacheConfigSeen firing",
    )
    assert [a["labels"]["alertname"] for a in firing] == ["E2eVllmCacheConfigSeen"]
    recorded = wait_until(
        lambda: prometheus.query("e2e:vllm_preemptions:rate1m"),
        timeout_s=20.0,
        what="the recording rule's series",
    )
    assert recorded[0]["metric"]["job"] == "vllm"


def test_prometheus_range_queries_return_one_second_samples(
    vllm_server: VllmServer, prometheus_factory: Callable[..., PrometheusServer]
) -> None:
    """Scrapes land about every second, so a range query over a few seconds has several points."""
    prometheus = prometheus_factory([ScrapeJob("vllm", [vllm_server.metrics_url])])
    prometheus.wait_for_targets_up("vllm")

    def last_four_seconds() -> list[list[Any]]:
        end = time.time()
        result = prometheus.query_range('up{job="vllm"}', start=end - 4.0, end=end, step_s=1.0)
        values: list[list[Any]] = result[0]["values"] if result else []
        return values if len(values) >= 4 else []

    values = wait_until(last_four_seconds, timeout_s=20.0, what="4 s of scrapes")
    assert [float(value) for _, value in values] == [1.0] * len(values)


def test_scrape_job_becomes_one_scrape_config_per_path() -> None:
    """A job's URLs share one scheme and path (with params for /probe); mixing paths is refused."""
    job = ScrapeJob(
        "fleet",
        ["http://127.0.0.1:9500/probe", "http://127.0.0.1:9501/probe"],
        params={"target": ["http://127.0.0.1:8000"]},
    )
    assert job.to_config() == {
        "job_name": "fleet",
        "scheme": "http",
        "metrics_path": "/probe",
        "static_configs": [{"targets": ["127.0.0.1:9500", "127.0.0.1:9501"]}],
        "params": {"target": ["http://127.0.0.1:8000"]},
    }
    mixed = ScrapeJob("mixed", ["http://127.0.0.1:1/metrics", "http://127.0.0.1:2/probe"])
    with pytest.raises(ValueError, match="one scheme and path"):
        mixed.to_config()


def test_prometheus_refuses_a_broken_rule_file(
    prometheus_factory: Callable[..., PrometheusServer], tmp_path: Path
) -> None:
    """A rule file that does not parse keeps Prometheus from starting, and says which file."""
    rules = tmp_path / "broken.rules.yml"
    rules.write_text(BROKEN_RULES)
    with pytest.raises(ServerStartError, match=re.escape("broken.rules.yml")):
        prometheus_factory([], rule_files=[rules])


def test_promtool_checks_rule_files(promtool: Path, tmp_path: Path) -> None:
    """promtool accepts the good rule file and rejects the broken one."""
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text(GOOD_RULES)
    bad.write_text(BROKEN_RULES)
    ok = subprocess.run(
        [promtool, "check", "rules", good], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "SUCCESS: 2 rules found" in ok.stdout
    broken = subprocess.run([promtool, "check", "rules", bad], capture_output=True, check=False)
    assert broken.returncode != 0


# ------------------------------------------------------------------------------------- Helm


def test_helm_is_the_pinned_helm_3(helm: Path) -> None:
    """The Helm binary runs and is the pinned 3.17 release."""
    done = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("v3.17.")


# --------------------------------------------------------------------------- process cleanup


def test_process_group_stop_ends_children_the_leader_left(tmp_path: Path) -> None:
    """stop() ends the leader and the children it spawned, as vLLM's engine processes need."""
    group = ProcessGroup(["sh", "-c", "sleep 300 & sleep 300 & wait"], log_path=tmp_path / "log")
    with group:
        pgid = group.pid
        assert pgid is not None
        assert not process_group_gone(pgid)
    assert process_group_gone(pgid)


@pytest.mark.parametrize("new_session", [True, False], ids=["session-leader", "not-a-leader"])
def test_niced_nices_the_command_and_its_own_session(tmp_path: Path, new_session: bool) -> None:
    """scripts/niced N runs the command at N in a session of its own at N, leaving ours alone.

    As a server's leader (the harness) it is the session already; in a script's background job
    it makes one. Either way the command keeps its pid, and its exit status is the command's.
    """
    report = (
        "echo $$ $(nice) $(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f4)"
        " $(sed 's/.* nice //' /proc/$$/autogroup 2>/dev/null || echo 7); exit 3"
    )
    ours = _autogroup_niceness(os.getpid())
    done = subprocess.run(
        ["bash", str(NICED), "7", "sh", "-c", report],
        check=False,
        capture_output=True,
        text=True,
        start_new_session=new_session,
        timeout=30,
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr == ""
    pid, niceness, session, session_niceness = map(int, done.stdout.split())
    assert (niceness, session, session_niceness) == (7, pid, 7)
    assert _autogroup_niceness(os.getpid()) == ours


def test_niced_refuses_a_niceness_it_cannot_set() -> None:
    """No command, a word or a niceness past 19: a usage line and status 2, nothing run."""
    for args in ([], ["10"], ["ten", "true"], ["20", "true"], ["-1", "true"]):
        done = subprocess.run(
            ["bash", str(NICED), *args], check=False, capture_output=True, text=True
        )
        assert done.returncode == 2, args
        assert done.stdout == ""
        assert done.stderr.startswith("usage: "), args


def test_process_group_is_killed_when_a_keyboard_interrupt_leaves_its_block(
    tmp_path: Path,
) -> None:
    """Ctrl-C inside the with-block still takes the whole group down."""
    group = ProcessGroup(["sh", "-c", "sleep 300 & wait"], log_path=tmp_path / "log")
    started: list[int | None] = []

    def interrupted() -> None:
        with group:
            started.append(group.pid)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    [pgid] = started
    assert pgid is not None
    assert process_group_gone(pgid)


def test_reaper_kills_the_group_when_the_test_process_dies(tmp_path: Path) -> None:
    """If the process that started a group is SIGKILLed, its reaper kills the group."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from harness import ProcessGroup
        group = ProcessGroup(["sleep", "300"], log_path=Path({str(tmp_path / "log")!r}))
        group.start()
        print(group.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    pgid = int(done.stdout.strip())
    wait_until(lambda: process_group_gone(pgid), timeout_s=10.0, what=f"group {pgid} reaped")
