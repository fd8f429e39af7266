"""``vllm-headroom serve``: the exporter process (sidecar or fleet mode).

This module is the command: its flags (generated from the settings table), the settings built
from flags over the environment, logging configured once, then
:func:`exporter.service.app.serve` until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from exporter.cli.logsetup import configure_logging
from exporter.service.app import serve
from exporter.service.settings import (
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
        parser.add_argument(
            flag,
            dest=name,
            metavar=None if choices else name.upper().removesuffix("_SECONDS"),
            choices=choices,
            help=f"{field.description} [{env_name(name)}]",
        )
    parser.add_argument(
        "--secrets-dir",
        metavar="DIR",
        help=f"directory of secret files, one per setting (default {DEFAULT_SECRETS_DIR})",
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


def run(args: argparse.Namespace) -> int:
    """Entry point of ``serve``."""
    settings = settings_from_args(args)
    configure_logging(level=settings.log_level, fmt=settings.log_format)
    return asyncio.run(serve(settings))
