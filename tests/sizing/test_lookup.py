"""Specification of the model lookup that plan and the sidecar share: one order, typed errors."""

from __future__ import annotations

import json
import shutil
from typing import TYPE_CHECKING

import pytest

from exporter.errors import ModelConfigError, ModelNotFoundError
from exporter.sizing.lookup import find_model_arch
from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

CONFIGS = paths.CONFIGS


def model_dir(tmp_path: Path, name: str, config: str = "tiny-llama") -> Path:
    """A model directory called ``name`` holding a fixture config.json."""
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(CONFIGS / config / "config.json", directory / "config.json")
    return directory


def test_files_come_before_the_catalogue_even_under_a_catalogue_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory named like a catalogue model is read as it is, not replaced by the entry."""
    monkeypatch.chdir(tmp_path)
    model_dir(tmp_path, "llama-3.1-8b", config="tiny-llama")
    found = find_model_arch("llama-3.1-8b")
    assert found.origin == "files"
    assert found.arch.num_layers == 2  # the tiny fixture, not Llama 3.1 8B's 32 layers
    assert found.arch.name == "llama-3.1-8b"


def test_a_name_with_no_files_comes_from_the_catalogue(tmp_path: Path) -> None:
    """A catalogue name, hub id or alias resolves offline when no files have it."""
    found = find_model_arch("meta-llama/Llama-3.1-8B-Instruct", hf_home=tmp_path)
    assert found.origin == "catalogue"
    assert (found.arch.num_layers, found.arch.num_kv_heads, found.arch.head_dim) == (32, 8, 128)
    assert found.weights_bytes is None


def test_another_name_of_the_same_model_is_tried_in_the_catalogue(tmp_path: Path) -> None:
    """vLLM's served model id stands in when its root path is not there."""
    found = find_model_arch(
        str(tmp_path / "gone"), also_known_as=(None, "llama-3.1-8b"), hf_home=tmp_path
    )
    assert found.origin == "catalogue"
    assert found.arch.num_layers == 32


def test_nothing_anywhere_is_a_typed_not_found_error(tmp_path: Path) -> None:
    """No directory, cached id or catalogue entry: ModelNotFoundError, saying what was tried."""
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        find_model_arch("acme/absent", hf_home=tmp_path)
    with pytest.raises(ModelNotFoundError, match="no model directory"):
        find_model_arch(str(tmp_path / "nowhere"))


def test_an_unusable_config_is_an_error_unless_the_catalogue_may_stand_in(tmp_path: Path) -> None:
    """A broken config.json is reported; the sidecar's fallback takes a known name instead."""
    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON") as caught:
        find_model_arch(str(broken), also_known_as=("llama-3.1-8b",))
    assert not isinstance(caught.value, ModelNotFoundError)
    found = find_model_arch(
        str(broken), also_known_as=("llama-3.1-8b",), catalogue_if_unusable=True
    )
    assert found.origin == "catalogue"
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        find_model_arch(str(broken), also_known_as=("no-such-model",), catalogue_if_unusable=True)


def test_the_checkpoint_beside_the_config_gives_the_weights(tmp_path: Path) -> None:
    """Weights come from the safetensors index next to config.json; a corrupt one is reported."""
    directory = model_dir(tmp_path, "tiny")
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 123_456}}))
    assert find_model_arch(str(directory)).weights_bytes == 123_456
    assert find_model_arch(str(directory / "config.json")).weights_bytes == 123_456
    index.write_text("{corrupt")
    found = find_model_arch(str(directory))
    assert found.weights_bytes is None
    assert found.weights_error is not None
    assert "not valid JSON" in found.weights_error
