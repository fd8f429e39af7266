"""``vllm-headroom serve``: the exporter process (sidecar or fleet mode).

This module is the command: its flags (generated from the settings table), the settings built
from flags over the environment, logging configured once, then
:func:`exporter.service.app.serve` until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from exporter.cli.logsetup import configure_logging
from exporter.errors import UsageError
from exporter.service.app import serve, wait_after_start_error
from exporter.service.settings import (
    DEFAULT_PORT,
    DEFAULT_SECRETS_DIR,
    FLAGS,
    Settings,
    env_name,
    load_settings,
)

if TYPE_CHECKING:
    import argparse

NAME = "serve"
HELP = "run the exporter (sidecar beside one vLLM, or fleet mode with /probe)"
DESCRIPTION = (
    "Poll a vLLM server's /metrics and the GPUs, derive KV-cache capacity and headroom, "
    "and serve them on /metrics. Every flag has an environment variable "
    "(HEADROOM_<SETTING>); see docs/configuration.md for all settings."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``serve`` (every setting also has a HEADROOM_* variable)."""
    for name, flag in FLAGS.items():
        field = Settings.model_fields[name]
        choices = _choices(name)
        # The choices are shown, and checked with the other settings (not by argparse, which
        # would exit before --on-start-error could make a bad one wait).
        shown = "{" + ",".join(choices) + "}" if choices else None
        parser.add_argument(
            flag,
            dest=name,
            metavar=shown or name.upper().removesuffix("_SECONDS"),
            help=f"{field.description} [{env_name(name)}]",
        )
    parser.add_argument(
        "--secrets-dir",
        metavar="DIR",
        help=f"directory of secret files, one per setting (default {DEFAULT_SECRETS_DIR})",
    )
    parser.add_argument(
        "--on-start-error",
        choices=START_ERROR_ACTIONS,
        default="exit",
        help=(
            "what a start-up error (a bad setting, an unreadable secret) does: exit with code 2"
            " (default), or print it, then wait answering 503 with it on every path but"
            " /-/healthy until stopped (the Helm chart's sidecar: an exiting container takes"
            " vLLM's pod out of its Service)"
        ),
    )


def _choices(name: str) -> list[str] | None:
    annotation = Settings.model_fields[name].annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [member.value for member in annotation]
    args = get_args(annotation)
    return list(args) if args and all(isinstance(a, str) for a in args) else None


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from flags over the environment (UsageError on a bad value)."""
    overrides = {name: getattr(args, name, None) for name in FLAGS}
    secrets = Path(args.secrets_dir) if getattr(args, "secrets_dir", None) else None
    return load_settings(overrides, secrets_dir=secrets)


#: ``--on-start-error`` choices.
START_ERROR_ACTIONS = ("exit", "wait")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``serve``."""
    try:
        settings = settings_from_args(args)
    except UsageError as exc:
        return _start_failed(args, exc, None)
    configure_logging(level=settings.log_level, fmt=settings.log_format)
    try:
        return asyncio.run(serve(settings))
    except UsageError as exc:
        return _start_failed(args, exc, settings)


def _start_failed(args: argparse.Namespace, error: UsageError, settings: Settings | None) -> int:
    """Exit (the UsageError goes on to the one-line message), or wait with it: see the flag."""
    if getattr(args, "on_start_error", "exit") != "wait":
        raise error
    print(f"vllm-headroom: error: {error}", file=sys.stderr)  # the line `exit` would print
    if settings is None:
        configure_logging(
            level=_raw_choice(args, "log_level", ("debug", "info", "warning", "error"), "info"),
            fmt=_raw_choice(args, "log_format", ("auto", "json", "console"), "auto"),
        )
        asked = (_raw_address(args), _raw_port(args))
    else:
        asked = (settings.listen_address, settings.port)
    default = (str(Settings.model_fields["listen_address"].default), asked[1])
    return wait_after_start_error(str(error), addresses=[asked, default])


def _raw(args: argparse.Namespace, name: str) -> str:
    """A setting's flag, else its variable, as given: the settings themselves did not load."""
    given = getattr(args, name, None)
    return str(given if given is not None else os.environ.get(env_name(name), "")).strip()


def _raw_choice(args: argparse.Namespace, name: str, choices: tuple[str, ...], default: str) -> str:
    value = _raw(args, name).lower()
    return value if value in choices else default


def _raw_port(args: argparse.Namespace) -> int:
    """The port asked for if it reads as one, else the default (the chart's probes use it)."""
    text = _raw(args, "port")
    if len(text) <= 5 and text.isascii() and text.isdigit() and int(text) <= 65_535:
        return int(text)
    return DEFAULT_PORT


def _raw_address(args: argparse.Namespace) -> str:
    """The address asked for if it reads as an IP address or a host name, else the default."""
    text = _raw(args, "listen_address").removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(text):
        return text  # "localhost": bound as asked, never widened to every interface first
    return str(Settings.model_fields["listen_address"].default)


#: What a listen address that is a host name may look like (letters, digits, '-' and '.').
_HOST_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
