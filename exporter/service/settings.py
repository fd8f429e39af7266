"""Settings of the ``serve`` command: one pydantic-settings class, built once in ``main``.

Precedence, highest first: command-line flags, environment variables (prefix ``HEADROOM_``),
a ``.env`` file in the working directory, files in the secrets directory (one file per setting,
named like the environment variable, e.g. ``HEADROOM_BEARER_TOKEN``), then the defaults below.
Every setting is documented in ``docs/configuration.md``; a test keeps the two in step.
"""

from __future__ import annotations

import io
import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from dotenv import dotenv_values
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from exporter.boundedread import FileReadError, read_bounded
from exporter.errors import UsageError
from exporter.gpu.dcgm import check_kubernetes_name
from exporter.gpu.model import IndexSelector, UuidSelector
from exporter.gpu.visibility import GpuSelectorError, parse_gpu_selectors, parse_selector
from exporter.service.allowlist import AllowlistError, check_url, parse_allowlist, redact_url
from exporter.sizing.overrides import overrides_problem

ENV_PREFIX = "HEADROOM_"

#: Our port: outside the 9100-9999 exporter range (fully allocated), not vLLM's 8000, not
#: dcgm-exporter's 9400, not used by any well-known exporter or inference server we know of.
DEFAULT_PORT = 8742

#: Where Kubernetes and Docker mount secrets by convention.
DEFAULT_SECRETS_DIR = Path("/run/secrets/vllm-headroom")


class Mode(StrEnum):
    """How the exporter finds its targets."""

    #: One vLLM target polled in the background, GPUs read through NVML (the main mode).
    SIDECAR = "sidecar"
    #: ``/probe?target=...`` for many vLLM instances that Prometheus discovers; no NVML.
    FLEET = "fleet"


class GpuDiscovery(StrEnum):
    """How the sidecar decides which GPUs are vLLM's."""

    #: ``gpus`` if set, else the vLLM process's ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``.
    AUTO = "auto"
    #: Only the ``gpus`` setting.
    SETTINGS = "settings"
    #: Every GPU NVML can see (only sensible when the container sees exactly vLLM's GPUs).
    ALL = "all"
    #: Do not read GPUs at all.
    NONE = "none"


class GpuSourceKind(StrEnum):
    """Where the sidecar reads vLLM's GPU memory (docs/kubernetes.md, "Choosing the GPU source")."""

    #: NVML inside the sidecar, on the GPUs gpu_discovery finds (needs the GPUs in its container).
    NVML = "nvml"
    #: The node's dcgm-exporter at dcgm_url, picking this pod's GPUs by its pod mapping.
    DCGM = "dcgm"
    #: No GPU figures (gpu_memory_bytes gives the sizing model the GPU's size).
    NONE = "none"


PositiveSeconds = Annotated[float, Field(gt=0, le=86_400)]
#: A poll more often than 20 times a second only burns CPU (1e-9 would spin a core).
PollSeconds = Annotated[float, Field(ge=0.05, le=86_400)]
TimeoutSeconds = Annotated[float, Field(ge=0.01, le=86_400)]
WindowSeconds = Annotated[float, Field(ge=0.1, le=86_400)]


class Settings(BaseSettings):
    """Every setting of ``vllm-headroom serve``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        # Foreign keys in a shared .env (COMPOSE_PROJECT_NAME...) are not ours to refuse; our
        # own misspelt ones are, by load_settings.
        extra="ignore",
        secrets_dir=None,
        validate_default=True,
        # "nan" and "inf" are no number of seconds or bytes: said so, not "less than 86400".
        allow_inf_nan=False,
    )

    # --- where to listen -------------------------------------------------------------------
    listen_address: str = Field(
        default="0.0.0.0",  # noqa: S104 - a sidecar must be reachable by Prometheus in the pod network
        description="Address to listen on for /metrics, /probe and the health endpoints.",
    )
    port: int = Field(
        default=DEFAULT_PORT, ge=0, le=65_535, description="Port to listen on (0: any free port)."
    )
    tls_cert_file: Path | None = Field(
        default=None, description="Serve HTTPS with this certificate (PEM); needs tls_key_file."
    )
    tls_key_file: Path | None = Field(
        default=None, description="Private key (PEM) for tls_cert_file."
    )

    # --- what to watch ---------------------------------------------------------------------
    mode: Mode = Field(default=Mode.SIDECAR, description="sidecar (one target) or fleet (/probe).")
    target: str = Field(
        default="http://127.0.0.1:8000",
        description="Base URL of the vLLM OpenAI-compatible server (sidecar mode).",
    )
    bearer_token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token for vLLM's HTTP API (vLLM --api-key): sent to the target in sidecar "
            "mode, and in fleet mode only to targets in bearer_token_targets."
        ),
    )
    poll_interval_seconds: PollSeconds = Field(
        default=5.0, description="How often to poll the target's /metrics."
    )
    poll_timeout_seconds: TimeoutSeconds = Field(
        default=3.0, description="Time limit for one HTTP request to vLLM."
    )
    max_response_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="Largest /metrics payload read from vLLM; larger ones fail the poll.",
    )
    memory_limit_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=32 * 1024 * 1024,
        # No practical ceiling: without a container limit the downward API passes the node's
        # allocatable memory, over 1 TiB on 8-GPU nodes, and refusing that would stop the sidecar.
        le=2**60,
        description=(
            "The exporter's memory limit (the chart passes its container's limit): a quarter "
            "of it bounds all the windows' samples together, the biggest window evicted first; "
            "in fleet mode another quarter bounds the /metrics answers read at once, shared "
            "fairly between probes."
        ),
    )
    context_window_seconds: WindowSeconds = Field(
        default=600.0, description="Requests finished within this window make up the p95 context."
    )
    context_min_requests: int = Field(
        default=400,
        ge=0,
        le=1_000_000,
        description=(
            "Fewest finished requests the p95 context is read from: with fewer in "
            "context_window_seconds the window reaches further back, up to "
            "context_max_window_seconds (0: never)."
        ),
    )
    context_max_window_seconds: WindowSeconds = Field(
        default=3600.0,
        description="How far back the context window may reach for context_min_requests.",
    )
    rate_window_seconds: WindowSeconds = Field(
        default=60.0,
        description=(
            "Window of the preemption and request rates; it reaches back to the last read at or "
            "before its start, so a read gap across it keeps what vLLM counted."
        ),
    )
    context_refresh_seconds: float = Field(
        default=30.0,
        ge=0.0,
        le=86_400,
        description=(
            "Context figures read from 400 requests or more are computed again at most this "
            "often (0: every poll); between, the last ones stand. On busy traffic they cost up "
            "to some 0.2 s of CPU a time, and 10 minutes of requests move little in 30 s."
        ),
    )

    # --- the model, for the prediction -----------------------------------------------------
    model: str | None = Field(
        default=None,
        description=(
            "Model directory, config.json path or Hugging Face id (looked up in the local HF "
            "cache). Default: the 'root' that vLLM's /v1/models reports."
        ),
    )
    hf_home: Path | None = Field(
        default=None,
        description="Hugging Face cache root (default: $HF_HOME or ~/.cache/huggingface).",
    )
    model_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description=(
            "Directories in which the model 'root' that vLLM's /v1/models reports may be read "
            "(its config.json and safetensors index, bounded): absolute paths, comma-separated "
            "in HEADROOM_MODEL_ROOTS. Empty: a root that is a path is never opened, and the "
            "model is found by the model setting, the HF cache or the catalogue. The chart sets "
            "the sidecar's model volume."
        ),
    )
    model_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Override fields of the model architecture read from config.json, e.g. "
            '{"num_kv_heads": 8} (JSON in HEADROOM_MODEL_OVERRIDES).'
        ),
    )
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=1024, description="vLLM --tensor-parallel-size (default 1)."
    )
    pipeline_parallel_size: int | None = Field(
        default=None, ge=1, le=1024, description="vLLM --pipeline-parallel-size (default 1)."
    )
    gpu_memory_bytes: int | None = Field(
        default=None, gt=0, description="Memory of one GPU, when NVML cannot tell (fleet mode)."
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description=(
            "vLLM --max-num-seqs, when its command line cannot be read (fleet mode, no shared "
            "process namespace) or it is set in a --config file the sidecar cannot read. "
            "Default: the command line's (or its --config file's), else vLLM's default for its "
            "version and GPU."
        ),
    )
    max_num_queued_reqs: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description=(
            "vLLM --max-num-queued-reqs (0.33+), when its command line cannot be read (fleet "
            "mode, no shared process namespace): the queue cap the headroom counts. Default: "
            "the command line's, else none known."
        ),
    )
    max_num_queued_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000_000,
        description=(
            "vLLM --max-num-queued-tokens (0.33+), when its command line cannot be read. "
            "Default: the command line's, else none known."
        ),
    )
    weights_bytes: int | None = Field(
        default=None, gt=0, description="Weights per GPU, when known better than the model files."
    )
    overhead_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Activation + non-torch overhead per GPU, to override the estimate.",
    )

    # --- GPUs ------------------------------------------------------------------------------
    gpu_source: GpuSourceKind = Field(
        default=GpuSourceKind.NVML,
        description=(
            "Where to read vLLM's GPU memory: nvml (in the sidecar, on the GPUs gpu_discovery "
            "finds), dcgm (the node's dcgm-exporter at dcgm_url; in fleet mode the one each "
            "probe names) or none."
        ),
    )
    dcgm_url: str | None = Field(
        default=None,
        description=(
            "gpu_source=dcgm: the /metrics URL of the dcgm-exporter on vLLM's node, e.g. "
            "http://$(NODE_IP):9400/metrics (the chart sets it). Read on every poll, within "
            "poll_timeout_seconds and 8 MiB. Sidecar mode only: in fleet mode each probe's "
            "dcgm= parameter names it."
        ),
    )
    pod_name: str | None = Field(
        default=None,
        description=(
            "This pod's name (downward API metadata.name): gpu_source=dcgm picks the GPUs "
            "dcgm-exporter's pod mapping gives this pod; needs pod_namespace."
        ),
    )
    pod_namespace: str | None = Field(
        default=None, description="This pod's namespace (downward API metadata.namespace)."
    )
    node_name: str | None = Field(
        default=None,
        description="This pod's node (downward API spec.nodeName), named in dcgm source errors.",
    )
    gpu_discovery: GpuDiscovery = Field(
        default=GpuDiscovery.AUTO,
        description=(
            "How to find vLLM's GPUs: auto, settings, all, none. With gpu_source=dcgm: auto "
            "also takes the GPU UUIDs of vLLM's NVIDIA_VISIBLE_DEVICES when the pod mapping "
            "has none; all is refused."
        ),
    )
    gpus: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="GPU UUIDs or indices to watch (comma-separated in HEADROOM_GPUS).",
    )
    proc_root: Path = Field(
        default=Path("/proc"),
        description="Where to find the vLLM process (a shared process namespace in Kubernetes).",
    )

    # --- fleet mode ------------------------------------------------------------------------
    probe_allowlist: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Targets /probe may reach: host names, host:port, IP addresses or CIDR networks "
            "(comma-separated in HEADROOM_PROBE_ALLOWLIST). Empty: /probe refuses everything."
        ),
    )
    bearer_token_targets: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Fleet mode: the targets that receive bearer_token, in the allowlist's forms "
            "(comma-separated in HEADROOM_BEARER_TOKEN_TARGETS); no other target gets it."
        ),
    )
    probe_max_targets: int = Field(
        default=1000, ge=1, le=100_000, description="Most targets whose windows are remembered."
    )
    probe_target_ttl_seconds: WindowSeconds = Field(
        default=1800.0, description="Forget a target not probed for this long."
    )

    # --- logging ---------------------------------------------------------------------------
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Lowest level logged."
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto", description="auto: console on a terminal, JSON otherwise."
    )

    @field_validator("target")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            return check_url(value)
        except AllowlistError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("dcgm_url")
    @classmethod
    def _dcgm_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "$(" in value:
            msg = (
                "holds an unexpanded $(...): define the variable it names before this one in "
                "the container's env (Kubernetes expands only variables defined earlier)"
            )
            raise ValueError(msg)
        try:
            return check_url(value)
        except AllowlistError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("pod_name", "pod_namespace", "node_name")
    @classmethod
    def _kubernetes_name(cls, value: str | None) -> str | None:
        return None if value is None else check_kubernetes_name(value)

    @field_validator("listen_address")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        text = value.strip()
        if not text or any(c.isspace() or not c.isprintable() for c in text) or "/" in text:
            msg = "must be an IP address or host name to listen on, like 0.0.0.0, :: or 127.0.0.1"
            raise ValueError(msg)
        return text

    @field_validator("model", "hf_home", mode="before")
    @classmethod
    def _not_empty(cls, value: object) -> object:
        # An empty variable (a template that rendered nothing) would silently mean "." here.
        if isinstance(value, str) and not value.strip():
            msg = "is empty: unset it to use the default, or give a value"
            raise ValueError(msg)
        return value

    @field_validator("bearer_token")
    @classmethod
    def _header_safe_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        # A trailing newline from `echo token > file` or a secret manager is not part of it.
        token = value.get_secret_value().strip()
        if not token:
            msg = "is empty: remove it, or give vLLM's --api-key value"
            raise ValueError(msg)
        if any(not (32 < ord(c) < 127) for c in token):
            msg = "has spaces, control or non-ASCII characters, which an HTTP header cannot carry"
            raise ValueError(msg)
        return SecretStr(token)

    @field_validator("hf_home")
    @classmethod
    def _hf_home_not_a_file(cls, value: Path | None) -> Path | None:
        # A directory not there yet is fine: vLLM may create the cache while downloading.
        if value is not None and value.exists() and not value.is_dir():
            msg = "is a file, not a directory: point it at the Hugging Face cache root"
            raise ValueError(msg)
        return value

    @field_validator(
        "gpus", "probe_allowlist", "bearer_token_targets", "model_roots", mode="before"
    )
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            if value.lstrip().startswith("["):  # a JSON list, as the chart renders lists
                try:
                    return json.loads(value)
                except ValueError:
                    msg = "is not a JSON list of strings; or give the items separated by commas"
                    raise ValueError(msg) from None
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("model_roots")
    @classmethod
    def _absolute_roots(cls, value: list[Path]) -> list[Path]:
        for root in value:
            if not root.is_absolute():
                msg = f"{str(root)!r} is not an absolute path; give directories like /models"
                raise ValueError(msg)
        return value

    @field_validator("gpus")
    @classmethod
    def _gpu_list(cls, value: list[str]) -> list[str]:
        if value:
            try:
                parse_gpu_selectors(value)
            except GpuSelectorError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("model_overrides")
    @classmethod
    def _overrides(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = overrides_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("probe_allowlist", "bearer_token_targets")
    @classmethod
    def _allowlist_entries(cls, value: list[str]) -> list[str]:
        try:
            parse_allowlist(value)
        except AllowlistError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            msg = "tls_cert_file and tls_key_file must be set together"
            raise ValueError(msg)
        if "proc_root" in self.model_fields_set and not self.proc_root.is_dir():
            msg = (
                f"proc_root ({env_name('proc_root')}) {str(self.proc_root)!r} is not a directory; "
                "point it at /proc (with a process namespace shared with vLLM in Kubernetes)"
            )
            raise ValueError(msg)
        if (
            self.mode is Mode.FLEET
            and self.bearer_token is not None
            and not (self.bearer_token_targets)
        ):
            msg = (
                "in fleet mode bearer_token is sent only to the targets that "
                f"bearer_token_targets ({env_name('bearer_token_targets')}) lists, and it lists "
                "none: name the vLLM hosts or networks that expect the token"
            )
            raise ValueError(msg)
        self._check_gpu_source()
        if self.gpu_discovery is GpuDiscovery.SETTINGS and not self.gpus:
            msg = (
                f"gpu_discovery=settings needs the gpus setting ({env_name('gpus')}): "
                "GPU UUIDs or indices"
            )
            raise ValueError(msg)
        if (
            "context_max_window_seconds" in self.model_fields_set
            and self.context_max_window_seconds < self.context_window_seconds
        ):
            msg = (
                f"context_max_window_seconds ({self.context_max_window_seconds:g}) must not be "
                f"shorter than context_window_seconds ({self.context_window_seconds:g}); raise "
                "it, or set context_min_requests to 0 to keep the window fixed"
            )
            raise ValueError(msg)
        if self.poll_timeout_seconds > self.poll_interval_seconds:
            msg = (
                f"poll_timeout_seconds ({self.poll_timeout_seconds:g}) must not exceed "
                f"poll_interval_seconds ({self.poll_interval_seconds:g})"
            )
            raise ValueError(msg)
        return self

    def _check_gpu_source(self) -> None:
        """The GPU source's settings: consistent, or one line saying what to set."""
        if (self.pod_name is None) != (self.pod_namespace is None):
            msg = (
                f"pod_name ({env_name('pod_name')}) and pod_namespace "
                f"({env_name('pod_namespace')}) must be set together (downward API "
                "metadata.name and metadata.namespace)"
            )
            raise ValueError(msg)
        if self.gpu_source is not GpuSourceKind.DCGM:
            if self.dcgm_url is not None:
                msg = (
                    f"dcgm_url is set but gpu_source is {self.gpu_source.value}: set "
                    f"gpu_source=dcgm ({env_name('gpu_source')}) to read it, or unset dcgm_url"
                )
                raise ValueError(msg)
            return
        if self.mode is Mode.FLEET:
            if self.dcgm_url is not None:
                msg = (
                    "in fleet mode each probe names its target's dcgm-exporter (the dcgm=, pod= "
                    f"and namespace= parameters): unset dcgm_url ({env_name('dcgm_url')})"
                )
                raise ValueError(msg)
        elif self.dcgm_url is None:
            msg = (
                f"gpu_source=dcgm needs dcgm_url ({env_name('dcgm_url')}): the /metrics URL of "
                "the dcgm-exporter on vLLM's node, e.g. http://$(NODE_IP):9400/metrics"
            )
            raise ValueError(msg)
        if self.gpu_discovery is GpuDiscovery.ALL:
            msg = (
                "gpu_discovery=all is refused with gpu_source=dcgm: dcgm-exporter lists every "
                "GPU of the node; use auto (the pod mapping) or the gpus setting"
            )
            raise ValueError(msg)
        for entry in self.gpus:
            selector = parse_selector(entry)
            if not isinstance(selector, UuidSelector | IndexSelector) or entry.startswith("MIG-"):
                msg = (
                    f"gpus entry {entry!r}: dcgm-exporter names MIG instances by their GPU's "
                    "UUID and GPU_I_ID, never by MIG UUID: list GPU UUIDs (GPU-...) or rely on "
                    "the pod mapping"
                )
                raise ValueError(msg)


#: The settings that also have a command-line flag (the common ones), and the flag.
FLAGS: dict[str, str] = {
    "target": "--target",
    "mode": "--mode",
    "listen_address": "--listen-address",
    "port": "--port",
    "poll_interval_seconds": "--poll-interval",
    "model": "--model",
    "hf_home": "--hf-home",
    "gpus": "--gpus",
    "gpu_discovery": "--gpu-discovery",
    "gpu_source": "--gpu-source",
    "dcgm_url": "--dcgm-url",
    "probe_allowlist": "--probe-allowlist",
    "tls_cert_file": "--tls-cert-file",
    "tls_key_file": "--tls-key-file",
    "log_level": "--log-level",
    "log_format": "--log-format",
}


def env_name(field_name: str) -> str:
    """The environment variable of a setting, e.g. ``HEADROOM_POLL_INTERVAL_SECONDS``."""
    return f"{ENV_PREFIX}{field_name.upper()}"


def load_settings(
    overrides: dict[str, Any] | None = None, *, secrets_dir: Path | None = None
) -> Settings:
    """Build the settings from flags (``overrides``), environment, .env and secrets files.

    Raises :class:`UsageError` with one line naming the first bad setting, its environment
    variable, what is wrong and the value given.
    """
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(given) - set(Settings.model_fields))
    if unknown:
        msg = f"unknown setting {unknown[0]}: check its spelling against docs/configuration.md"
        raise UsageError(msg)
    for name, value in given.items():
        _check_raw(name, value, where=FLAGS.get(name, name))
    for key, text in os.environ.items():
        name = key[len(ENV_PREFIX) :].lower() if key.upper().startswith(ENV_PREFIX) else ""
        if name in Settings.model_fields:
            _check_raw(name, text, where=key)
    _check_dotenv(Path(".env"))
    if secrets_dir is None and DEFAULT_SECRETS_DIR.is_dir():
        secrets_dir = DEFAULT_SECRETS_DIR
    elif secrets_dir is not None and not secrets_dir.is_dir():
        msg = f"the secrets directory {str(secrets_dir)!r} does not exist; fix --secrets-dir"
        raise UsageError(msg)
    if secrets_dir is not None:
        _check_secrets(secrets_dir)
    try:
        return Settings(_secrets_dir=secrets_dir, **given)
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc)) from None
    except RecursionError:
        # Nesting is checked above; this is the last guard, never a traceback.
        raise UsageError("invalid settings: a value nests too deeply") from None
    except OSError as exc:
        # A path setting a validator examines (lengths are checked above): the last guard.
        msg = f"invalid settings: cannot examine {exc.filename!r}: {exc.strerror}"
        raise UsageError(msg[:500]) from None
    except SettingsError as exc:
        # pydantic-settings could not decode a variable (e.g. bad JSON in a dict setting).
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        msg = (
            f"invalid setting {field} ({env_name(field)}): cannot decode its value "
            "(JSON expected); see docs/configuration.md"
        )
        raise UsageError(msg) from None


#: Longest value of one setting, from any source: paths, URLs and tokens fit in 8 KiB (PATH_MAX
#: is 4,096); a list or a JSON object may take 64 KiB (an allowlist of a thousand networks).
MAX_VALUE_CHARS = 8 * 1024
MAX_LIST_CHARS = 64 * 1024
#: Longest path (Linux's PATH_MAX): a longer one fails every file call with ENAMETOOLONG.
MAX_PATH_CHARS = 4096
#: The settings that name files or directories (each item of model_roots too).
_PATH_SETTINGS = frozenset(
    {"tls_cert_file", "tls_key_file", "model", "hf_home", "proc_root", "model_roots"}
)
#: The settings given as lists or JSON objects.
_LONG_SETTINGS = frozenset(
    {"gpus", "probe_allowlist", "bearer_token_targets", "model_roots", "model_overrides"}
)
#: Deepest nesting of brackets in a value (a JSON setting is an object of plain values).
MAX_VALUE_DEPTH = 32
#: Largest ``.env`` file or secret file read, and the time allowed to read one.
MAX_FILE_BYTES = 1024 * 1024
FILE_TIMEOUT_S = 1.0
#: Characters of a bad value quoted in an error line.
SHOWN_CHARS = 120


def _nesting(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``text`` (quotes ignored: a bound, not a parse)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def _check_raw(name: str, value: object, *, where: str) -> None:
    """Refuse a value no setting can hold before it is parsed: too long, or nested too deep.

    A 100 kB host name or ``[[[[...]]]]`` a hundred thousand deep costs the parsers time and
    stack (a RecursionError); here it is one line.
    """
    texts = [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    longest = MAX_LIST_CHARS if name in _LONG_SETTINGS else MAX_VALUE_CHARS
    if name in _PATH_SETTINGS:
        longest = MAX_PATH_CHARS
    for text in texts:
        if len(text) > longest:
            msg = (
                f"invalid setting {name} ({where}): {len(text):,} characters long; the longest "
                f"accepted is {longest:,}"
            )
            raise UsageError(msg)
        if _nesting(text) > MAX_VALUE_DEPTH:
            msg = (
                f"invalid setting {name} ({where}): nests brackets more than {MAX_VALUE_DEPTH} "
                "deep; give a flat JSON object or list"
            )
            raise UsageError(msg)


def _read_text_file(path: Path, what: str) -> str:
    """A ``.env`` or secret file: regular, at most MAX_FILE_BYTES, UTF-8, read within a second."""
    try:
        raw = read_bounded(
            path, max_bytes=MAX_FILE_BYTES, timeout_s=FILE_TIMEOUT_S, regular_only=True
        )
        return raw.decode("utf-8")
    except FileReadError as exc:
        raise UsageError(f"{exc}; fix or remove the {what}") from None
    except UnicodeDecodeError as exc:
        msg = f"{path} is not UTF-8 text (byte {exc.start}); fix or remove the {what}"
        raise UsageError(msg) from None


def _check_dotenv(path: Path) -> None:
    """Refuse a ``.env`` that cannot be read as text, or a ``HEADROOM_*`` key that is no setting.

    Other keys belong to other tools sharing the file (``COMPOSE_PROJECT_NAME``): ignored. A
    FIFO, a device, an unreadable or non-UTF-8 file is one line here, before pydantic-settings
    opens it (which would wait on a FIFO for ever).
    """
    if not os.path.lexists(path):
        return
    text = _read_text_file(path, ".env file")
    values = dotenv_values(stream=io.StringIO(text))
    known = {env_name(name) for name in Settings.model_fields}
    for key, value in values.items():
        if key.upper().startswith(ENV_PREFIX) and key.upper() not in known:
            msg = (
                f"unknown setting {key} in {path}: remove it or check its spelling against "
                "docs/configuration.md"
            )
            raise UsageError(msg)
        if key.upper() in known and value is not None:
            _check_raw(
                key.upper().removeprefix(ENV_PREFIX).lower(), value, where=f"{key} in {path}"
            )


def _check_secrets(directory: Path) -> None:
    """Each secret file of a setting: a regular UTF-8 file of sane size and shape."""
    for name in Settings.model_fields:
        path = directory / env_name(name)
        if os.path.lexists(path):
            _check_raw(name, _read_text_file(path, "secret file").strip(), where=str(path))


def describe_validation_error(exc: ValidationError) -> str:
    """One line for the first problem of a pydantic ``ValidationError``."""
    error = exc.errors()[0]
    loc = [str(part) for part in error.get("loc", ())]
    message = str(error.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")
    if not loc:
        return f"invalid settings: {message}"
    name = loc[0]
    where = f"setting {name} ({env_name(name)})"
    if error.get("type") == "extra_forbidden":
        return f"unknown {where}: remove it or check its spelling against docs/configuration.md"
    given = error.get("input")
    if isinstance(given, str) and "://" in given:
        given = redact_url(given)  # a password in a URL is not echoed
    if len(message) > 4 * SHOWN_CHARS:
        message = message[: 4 * SHOWN_CHARS] + "..."
    shown = "" if isinstance(given, dict) else f"; got {_shown(given)}"
    if isinstance(given, SecretStr) or "token" in name:
        shown = ""  # never echo secrets
    return f"invalid {where}: {message}{shown}"


def _shown(value: object) -> str:
    """A value as an error line quotes it: its repr, cut at SHOWN_CHARS."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text):,} chars)"


def render_configuration_markdown() -> str:
    """The settings table of ``docs/configuration.md`` (a test keeps the file equal to this)."""
    lines = [
        "# Configuration",
        "",
        "`vllm-headroom serve` reads one set of settings. Precedence, highest first:",
        "command-line flags, environment variables (prefix `HEADROOM_`), a `.env` file in the",
        "working directory,"
        f" files in the secrets directory (`--secrets-dir`, default `{DEFAULT_SECRETS_DIR}`: one",
        "file per setting, named like its variable, e.g. `HEADROOM_BEARER_TOKEN`), then defaults.",
        "Lists are comma-separated in variables; `HEADROOM_MODEL_OVERRIDES` is JSON. A bad value",
        "stops the exporter with one line naming the setting, its variable and the problem, and",
        "exit code 2; with `serve --on-start-error wait` (the Helm chart's sidecar) it is printed,",
        "then answered with 503 on every path but `/-/healthy` until the process is stopped:",
        "beside vLLM, a container that exits backs off, and vLLM's pod is unready meanwhile.",
        "Whatever the setting, a value may hold at most"
        f" {MAX_VALUE_CHARS // 1024} KiB ({MAX_PATH_CHARS:,} characters for a path,"
        f" {MAX_LIST_CHARS // 1024} KiB for a list or JSON) nested at most {MAX_VALUE_DEPTH}",
        "brackets deep; `.env` and secret files must be regular UTF-8 files of at most"
        f" {MAX_FILE_BYTES // 2**20} MiB.",
        "Generated from `exporter/service/settings.py` by `make docs`.",
        "",
        "| setting | variable | flag | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, field in Settings.model_fields.items():
        if field.default_factory is not None:
            default: object = field.default_factory()  # type: ignore[call-arg]
        else:
            default = field.default
        if isinstance(default, StrEnum):
            default = default.value
        shown = "-" if default in (None, [], {}) else f"`{default}`"
        flag = f"`{FLAGS[name]}`" if name in FLAGS else "-"
        lines.append(f"| `{name}` | `{env_name(name)}` | {flag} | {shown} | {field.description} |")
    lines.append("")
    return "\n".join(lines)
