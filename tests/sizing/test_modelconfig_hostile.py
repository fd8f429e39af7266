"""Specification: any value in any field of a real config.json is sized or refused in one line.

A config.json is input from whoever published the checkpoint (or from a vLLM target's model
root, in the sidecar). Each field of each real config under tests/fixtures/configs/, down to
four levels (lists by their first two entries), is replaced in turn by every class of value a
JSON document can hold where a number, a string or an object was expected: NaN and infinities
(Python's json reads them), huge and negative numbers, fractions, booleans, strings, empty and
nested containers, null. Each result must be sized with finite, non-negative figures, declined
with a reason, or refused with :class:`~exporter.errors.UsageError` (one line, as ``plan``
prints it): never another exception, which ``plan`` would print as a traceback and the sidecar
would count as an internal error.
"""

from __future__ import annotations

import copy
import json
import math
from typing import TYPE_CHECKING, Any

import pytest

from exporter.errors import UsageError
from exporter.sizing.model import Declined, Deployment, size_deployment
from exporter.sizing.modelconfig import parse_model_config
from tests import paths

if TYPE_CHECKING:
    from collections.abc import Iterator

GIB = 1024**3
#: Every class of value a field may be given instead of the one it should hold.
HOSTILE: tuple[Any, ...] = (
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1,
    0,
    0.5,
    2**64,
    10**300,
    True,
    "",
    "4",
    "x" * 50,
    [],
    [1, "a", None],
    {},
    {"a": {"b": [1]}},
    None,
)
#: How deep fields are replaced; lists are walked through their first entries only.
DEPTH = 4
LIST_ENTRIES = 2

#: Published configs, and the tiny ones real vLLM 0.32 served here (hybrids, gpt-oss, Llama 4).
CONFIG_FILES = {
    f"{path.parent.parent.name}/{path.parent.name}": path
    for path in [
        *sorted(paths.CONFIGS.glob("*/config.json")),
        *sorted((paths.VLLM_CPU / "architectures").glob("*/config.json")),
    ]
}
#: Fields of the reader's other branches, added to Llama 3.1 8B's config: each weight format's
#: ``quantization_config`` and each rope scaling type.
DECORATIONS: dict[str, dict[str, Any]] = {
    "gptq": {"quantization_config": {"quant_method": "gptq", "bits": 4, "sym": True}},
    "awq": {"quantization_config": {"quant_method": "awq", "w_bit": 4}},
    "fp8": {"quantization_config": {"quant_method": "fp8"}},
    "mxfp4": {"quantization_config": {"quant_method": "mxfp4"}},
    "compressed-tensors": {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}},
        }
    },
    "rope-linear": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "rope-dynamic": {"rope_scaling": {"type": "dynamic", "factor": 4}},
    "rope-yarn": {
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        }
    },
    "rope-longrope": {
        "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]},
        "original_max_position_embeddings": 4096,
    },
    "model-max-length": {"model_max_length": 262144},
}


def field_paths(value: Any, depth: int = DEPTH) -> Iterator[tuple[str | int, ...]]:
    """The paths of every field under ``value`` (object keys, list indices), depth first."""
    if depth == 0:
        return
    if isinstance(value, dict):
        items: list[tuple[str | int, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value[:LIST_ENTRIES]))
    else:
        return
    for key, child in items:
        yield (key,)
        for rest in field_paths(child, depth - 1):
            yield (key, *rest)


def replaced(config: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``config`` with the field at ``path`` set to ``value``."""
    changed = copy.deepcopy(config)
    parent: Any = changed
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return changed


def outcome(config: dict[str, Any]) -> str:
    """``sized``, ``declined`` or ``refused``; any other exception fails the test."""
    try:
        arch = parse_model_config(config, name="hostile")
        result = size_deployment(arch, deployment=Deployment(gpu_memory_bytes=80 * GIB))
    except UsageError as refused:
        message = str(refused)
        assert message, "an empty refusal"
        assert "\n" not in message, message
        return "refused"
    if isinstance(result, Declined):
        assert result.reason
        return "declined"
    # The budget may be below 0 (the weights do not fit: plan says so in one line).
    assert math.isfinite(result.kv_budget_bytes)
    figures = (
        result.bytes_per_token,
        result.kv_blocks,
        result.kv_capacity_tokens,
        result.max_model_len,
    )
    assert all(math.isfinite(f) and f >= 0 for f in figures), figures
    return "sized"


def base_config(name: str) -> dict[str, Any]:
    """The named real config, or Llama 3.1 8B's with one of :data:`DECORATIONS`."""
    if name in CONFIG_FILES:
        loaded: dict[str, Any] = json.loads(CONFIG_FILES[name].read_text())
        return loaded
    llama = json.loads((paths.CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text())
    return {**llama, "rope_scaling": None, **DECORATIONS[name]}


@pytest.mark.parametrize("name", [*CONFIG_FILES, *DECORATIONS])
def test_every_field_of_a_real_config_takes_any_value_without_a_crash(name: str) -> None:
    """Replacing any field by any hostile value is sized, declined or refused in one line."""
    config = base_config(name)
    assert outcome(config) in {"sized", "declined"}  # the config itself
    crashes = []
    for path in field_paths(config):
        for value in HOSTILE:
            try:
                outcome(replaced(config, path, value))
            except Exception as exc:  # noqa: BLE001 - collected, reported together below
                crashes.append(f"{'.'.join(map(str, path))} = {value!r:.30}: {exc!r:.160}")
    assert not crashes, f"{len(crashes)} crashes, e.g.:\n" + "\n".join(crashes[:15])
