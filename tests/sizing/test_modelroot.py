"""Specification of what a target's model root may make the exporter read (model_roots)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.sizing.modelroot import RootKind, classify_root, is_hub_id, within

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(
    ("root", "hub"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", True),
        ("Qwen/Qwen2.5-0.5B", True),
        ("/models/llama", False),
        ("models/../etc", False),
        ("../x", False),
        ("a/..", False),
        ("gpt2", False),
        ("a/b/c", False),
    ],
)
def test_only_org_slash_name_is_a_hub_id(root: str, hub: bool) -> None:
    """A hub id has one slash and no dot-dot; paths and bare names are not hub ids."""
    assert is_hub_id(root) is hub


def test_a_path_is_allowed_only_inside_model_roots(tmp_path: Path) -> None:
    """Inside an allowed directory: allowed; the directory itself too; outside, or none: not."""
    allowed = tmp_path / "models"
    (allowed / "llama").mkdir(parents=True)
    assert classify_root(str(allowed / "llama"), [allowed]) is RootKind.ALLOWED_PATH
    assert classify_root(str(allowed), [allowed]) is RootKind.ALLOWED_PATH
    assert classify_root(str(tmp_path / "other"), [allowed]) is RootKind.NAME_ONLY
    assert classify_root(str(allowed / "llama"), []) is RootKind.NAME_ONLY
    assert classify_root("/dev/zero", [allowed]) is RootKind.NAME_ONLY


def test_dot_dot_and_symbolic_links_are_resolved_before_the_check(tmp_path: Path) -> None:
    """Any ``..`` (even one that stays inside) and a link from inside to outside are outside."""
    allowed = tmp_path / "models"
    allowed.mkdir()
    (allowed / "escape").symlink_to("/etc")
    assert classify_root(f"{allowed}/../secret", [allowed]) is RootKind.NAME_ONLY
    assert classify_root(f"{allowed}/llama/../llama", [allowed]) is RootKind.NAME_ONLY
    assert classify_root(str(allowed / "escape"), [allowed]) is RootKind.NAME_ONLY
    assert within(allowed / "escape" / "passwd", [allowed]) is None


def test_a_relative_path_is_never_a_local_path(tmp_path: Path) -> None:
    """A relative root would be relative to the exporter's directory, not vLLM's: name only."""
    assert classify_root("tiny-llama", [tmp_path]) is RootKind.NAME_ONLY
    assert classify_root("./tiny-llama", [tmp_path]) is RootKind.NAME_ONLY
