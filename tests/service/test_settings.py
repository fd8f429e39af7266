"""Specification of the serve settings: precedence, validation and one-line errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.errors import UsageError
from exporter.service.settings import DEFAULT_PORT, Mode, load_settings
from tests import paths

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No HEADROOM_* variable or .env file leaks in from the developer's shell."""
    import os

    for name in list(os.environ):
        if name.startswith("HEADROOM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_defaults_watch_the_local_vllm_on_our_own_port() -> None:
    """Out of the box the sidecar polls http://127.0.0.1:8000 and listens on its port."""
    settings = load_settings()
    assert settings.target == "http://127.0.0.1:8000"
    assert settings.port == DEFAULT_PORT
    assert settings.mode is Mode.SIDECAR


def test_flags_override_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag wins over HEADROOM_* variables, which win over defaults."""
    monkeypatch.setenv("HEADROOM_PORT", "9999")
    monkeypatch.setenv("HEADROOM_TARGET", "http://vllm:8000")
    settings = load_settings({"port": 1234, "target": None})
    assert settings.port == 1234
    assert settings.target == "http://vllm:8000"


def test_comma_separated_lists_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """HEADROOM_GPUS=GPU-a,GPU-b gives two GPUs."""
    monkeypatch.setenv("HEADROOM_GPUS", "GPU-a, GPU-b")
    assert load_settings().gpus == ["GPU-a", "GPU-b"]


def test_model_roots_come_from_the_environment_and_default_to_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No directory is allowed unless named; HEADROOM_MODEL_ROOTS=/a,/b names two."""
    assert load_settings().model_roots == []
    monkeypatch.setenv("HEADROOM_MODEL_ROOTS", "/models, /mnt/weights")
    assert [str(p) for p in load_settings().model_roots] == ["/models", "/mnt/weights"]


def test_a_container_without_a_memory_limit_still_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without limits.memory the downward API passes the node's memory: 2 TiB on an 8-GPU node."""
    two_tib = str(2 * 1024**4)
    monkeypatch.setenv("HEADROOM_MEMORY_LIMIT_BYTES", two_tib)
    assert load_settings().memory_limit_bytes == int(two_tib)


def test_the_bearer_token_comes_from_the_secrets_directory(tmp_path: Path) -> None:
    """A file named like the variable in the secrets directory sets the token, kept secret."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "HEADROOM_BEARER_TOKEN").write_text("s3cret\n")
    settings = load_settings(secrets_dir=secrets)
    assert settings.bearer_token is not None
    assert settings.bearer_token.get_secret_value().strip() == "s3cret"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"port": -1}, "invalid setting port (HEADROOM_PORT)"),
        ({"target": "ftp://x"}, "invalid setting target (HEADROOM_TARGET): must be an http://"),
        ({"poll_interval_seconds": -1}, "HEADROOM_POLL_INTERVAL_SECONDS"),
        ({"mode": "cluster"}, "invalid setting mode (HEADROOM_MODE)"),
        ({"probe_allowlist": "http://x"}, "without a scheme"),
        ({"tls_cert_file": "/x.pem"}, "tls_cert_file and tls_key_file must be set together"),
        ({"model_roots": "models"}, "model_roots (HEADROOM_MODEL_ROOTS): 'models' is not an abs"),
    ],
)
def test_bad_settings_are_one_line_naming_the_setting(
    overrides: dict[str, object], expected: str
) -> None:
    """Each bad value is reported on one line with the setting and its variable."""
    with pytest.raises(UsageError) as caught:
        load_settings(overrides)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message


def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """HEADROOM_PORT=abc names HEADROOM_PORT and the value given."""
    monkeypatch.setenv("HEADROOM_PORT", "abc")
    with pytest.raises(UsageError, match=r"HEADROOM_PORT.*'abc'"):
        load_settings()


def test_poll_timeout_may_not_exceed_the_interval() -> None:
    """A timeout longer than the interval would let polls pile up."""
    with pytest.raises(UsageError, match="must not exceed"):
        load_settings({"poll_interval_seconds": 2, "poll_timeout_seconds": 5})


def test_the_context_windows_reach_is_never_shorter_than_the_window() -> None:
    """A longer context window carries the reach with it; a reach set shorter is refused."""
    from exporter.service.app import _poll_settings

    longer = _poll_settings(load_settings({"context_window_seconds": 7200}))
    assert longer.windows.context_max_seconds == 7200
    assert longer.windows.context_min_requests == 400
    with pytest.raises(UsageError, match=r"context_max_window_seconds \(600\) must not be shorter"):
        load_settings({"context_window_seconds": 900, "context_max_window_seconds": 600})


def test_the_queue_caps_reach_the_pollers() -> None:
    """max_num_queued_reqs and _tokens are the caps a poller falls back on; unset, none."""
    from exporter.core.ceiling import QueueCaps
    from exporter.service.app import _poll_settings

    given = {"max_num_queued_reqs": 64, "max_num_queued_tokens": 100_000}
    assert _poll_settings(load_settings(given)).queue_caps == QueueCaps(64, 100_000)
    assert _poll_settings(load_settings({})).queue_caps == QueueCaps()
    with pytest.raises(UsageError, match="max_num_queued_reqs"):
        load_settings({"max_num_queued_reqs": 0})


def test_secret_values_are_never_echoed_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid token setting does not print the token."""
    monkeypatch.setenv("HEADROOM_BEARER_TOKEN", "x" * 3)
    monkeypatch.setenv("HEADROOM_PORT", "70000")
    with pytest.raises(UsageError) as caught:
        load_settings()
    assert "xxx" not in str(caught.value)


def test_docs_configuration_md_is_generated_from_the_settings() -> None:
    """docs/configuration.md lists every setting as `make docs` generates it."""
    from exporter.service.settings import render_configuration_markdown

    docs = paths.DOCS / "configuration.md"
    assert docs.read_text() == render_configuration_markdown()


def test_every_flag_names_a_setting_and_serve_help_lists_it() -> None:
    """Each serve flag maps to a real setting and appears in --help with its variable."""
    import contextlib
    import io

    from exporter.cli.main import main
    from exporter.service.settings import FLAGS, Settings, env_name

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["serve", "--help"])
    text = " ".join(out.getvalue().split())
    for name, flag in FLAGS.items():
        assert name in Settings.model_fields
        assert flag in text
        assert f"[{env_name(name)}]" in text


@pytest.mark.parametrize("discovery", ["auto", "settings", "all", "none"])
def test_a_bad_gpu_list_is_refused_at_start_whatever_the_discovery_mode(discovery: str) -> None:
    """The gpus setting is checked with the other settings, not later by whichever uses it."""
    with pytest.raises(UsageError, match=r"invalid setting gpus \(HEADROOM_GPUS\).*'gpu0'"):
        load_settings({"gpus": "gpu0", "gpu_discovery": discovery})


def test_model_overrides_are_checked_with_the_settings() -> None:
    """Unknown override fields and non-positive values fail at start, naming field and fix."""
    with pytest.raises(UsageError, match=r"unknown field 'kv_heads'; known fields: .*num_kv_heads"):
        load_settings({"model_overrides": {"kv_heads": 8}})
    with pytest.raises(UsageError, match="num_layers must be a positive integer, got 0"):
        load_settings({"model_overrides": {"num_layers": 0}})
    with pytest.raises(UsageError, match="dtype must be a string, got 16"):
        load_settings({"model_overrides": {"dtype": 16}})
    settings = load_settings({"model_overrides": {"num_kv_heads": 8, "dtype": "bfloat16"}})
    assert settings.model_overrides == {"num_kv_heads": 8, "dtype": "bfloat16"}


def test_list_settings_take_commas_or_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """HEADROOM_GPUS=0,1 and the chart's ["0","1"] mean the same; broken JSON is one line."""
    monkeypatch.setenv("HEADROOM_BEARER_TOKEN_TARGETS", '["10.0.0.0/8", "vllm.prod"]')
    assert load_settings().bearer_token_targets == ["10.0.0.0/8", "vllm.prod"]
    monkeypatch.setenv("HEADROOM_BEARER_TOKEN_TARGETS", "10.0.0.0/8, vllm.prod")
    assert load_settings().bearer_token_targets == ["10.0.0.0/8", "vllm.prod"]
    monkeypatch.setenv("HEADROOM_BEARER_TOKEN_TARGETS", '["10.0.0.0/8"')
    with pytest.raises(UsageError, match="not a JSON list"):
        load_settings()


def test_a_password_in_the_target_is_never_echoed() -> None:
    """A setting error shows the target with its password replaced."""
    with pytest.raises(UsageError) as caught:
        load_settings({"target": "http://admin:s3cret@vllm:99999"})
    assert "s3cret" not in str(caught.value)
    assert "admin:***@vllm:99999" in str(caught.value)


def test_a_foreign_key_in_dotenv_is_ignored_and_a_misspelt_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """.env may hold other tools' keys; a HEADROOM_ key that is no setting is a typo."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("COMPOSE_PROJECT_NAME=x\nHEADROOM_PORT=9000\n")
    assert load_settings().port == 9000
    (tmp_path / ".env").write_text("HEADROOM_POLL_INTERVAL=5\n")
    with pytest.raises(UsageError, match=r"unknown setting HEADROOM_POLL_INTERVAL in \.env"):
        load_settings()


# --- the GPU source -----------------------------------------------------------------------------


def test_the_dcgm_source_takes_its_url_and_the_pods_identity() -> None:
    """gpu_source=dcgm with the node's dcgm-exporter and the downward API's pod identity."""
    settings = load_settings(
        {
            "gpu_source": "dcgm",
            "dcgm_url": "http://10.0.3.7:9400/metrics",
            "pod_name": "llama-0",
            "pod_namespace": "inference",
            "node_name": "gpu-node-07",
        }
    )
    assert settings.gpu_source.value == "dcgm"
    assert settings.dcgm_url == "http://10.0.3.7:9400/metrics"
    assert (settings.pod_name, settings.pod_namespace) == ("llama-0", "inference")


def test_fleet_mode_takes_the_dcgm_source_without_a_url_each_probe_names_its_own() -> None:
    """Fleet mode reads the dcgm-exporter each probe names (dcgm=): no dcgm_url to set."""
    settings = load_settings({"gpu_source": "dcgm", "mode": "fleet"})
    assert (settings.gpu_source.value, settings.dcgm_url) == ("dcgm", None)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"gpu_source": "dcgm"}, "gpu_source=dcgm needs dcgm_url"),
        ({"dcgm_url": "http://10.0.3.7:9400/metrics"}, "dcgm_url is set but gpu_source is nvml"),
        (
            {"gpu_source": "dcgm", "dcgm_url": "http://$(NODE_IP):9400/metrics"},
            "unexpanded $(...)",
        ),
        (
            {"gpu_source": "dcgm", "dcgm_url": "http://h:9400/metrics", "mode": "fleet"},
            "each probe names its target's dcgm-exporter",
        ),
        (
            {"gpu_source": "dcgm", "dcgm_url": "http://h:9400/metrics", "gpu_discovery": "all"},
            "gpu_discovery=all is refused with gpu_source=dcgm",
        ),
        (
            {
                "gpu_source": "dcgm",
                "dcgm_url": "http://h:9400/metrics",
                "gpus": "MIG-4f1b9f5e-3c2a-5b8e-9d0f-1a2b3c4d5e6f",
            },
            "never by MIG UUID",
        ),
        ({"pod_name": "llama-0"}, "must be set together"),
        ({"pod_name": "Llama 0!", "pod_namespace": "x"}, "is not a Kubernetes name"),
        ({"gpu_source": "dcgm", "dcgm_url": "ftp://h/metrics"}, "dcgm_url"),
    ],
)
def test_a_gpu_source_that_cannot_work_is_refused_at_start(
    given: dict[str, str], said: str
) -> None:
    """Each inconsistent GPU source is one line at start-up, never a silent lack of figures."""
    with pytest.raises(UsageError) as caught:
        load_settings(given)
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)
