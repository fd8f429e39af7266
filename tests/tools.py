"""The real tools the tests run (Helm, promtool, kubectl, checkov, Alertmanager), found once.

The installers (``make deps``, ``scripts/e2e/install-*.sh``) put every tool into the cache;
``tests/e2e/harness.py`` knows where. A test that needs a missing tool FAILS when ``CI`` is set
to true (a CI run must never pass by skipping), naming the tool and its install command, and
skips with the same message on a developer's machine.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

import pytest

from tests.e2e.harness import MissingResourceError

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


def in_ci() -> bool:
    """True when the environment says this is a CI run (``CI=true``, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require(locate: Callable[[], T]) -> T:
    """Return ``locate()``; if the resource is missing, fail in CI and skip elsewhere."""
    try:
        return locate()
    except MissingResourceError as exc:
        if in_ci():
            pytest.fail(f"CI=true and {exc}", pytrace=False)
        pytest.skip(str(exc))
