"""The ``model_overrides`` setting: architecture fields a user replaces when config.json is wrong.

A pydantic model (unknown fields refused, integers strictly positive), so the sidecar's settings
and :class:`~exporter.sizing.predictor.ModelPredictor` check overrides the same way, once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from exporter.errors import UsageError
from exporter.validation import first_problem

if TYPE_CHECKING:
    from collections.abc import Mapping

_POSITIVE = "a positive integer"
Positive = Annotated[int, Field(strict=True, gt=0, description=_POSITIVE)]
Text = Annotated[str, Field(strict=True, description="a string")]


class ModelOverrides(BaseModel):
    """ModelArch fields that ``model_overrides`` may replace; absent ones are kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_layers: Positive = None  # type: ignore[assignment]
    num_attention_heads: Positive = None  # type: ignore[assignment]
    num_kv_heads: Positive = None  # type: ignore[assignment]
    head_dim: Positive = None  # type: ignore[assignment]
    hidden_size: Positive = None  # type: ignore[assignment]
    vocab_size: Positive = None  # type: ignore[assignment]
    params: Positive = None  # type: ignore[assignment]
    dtype: Text = None  # type: ignore[assignment]
    sliding_window: Positive = None  # type: ignore[assignment]
    quantization: Text = None  # type: ignore[assignment]
    max_position_embeddings: Positive = None  # type: ignore[assignment]


def overrides_problem(overrides: object) -> str | None:
    """What is wrong with ``overrides`` in one line (``None`` when nothing is)."""
    try:
        ModelOverrides.model_validate(overrides)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] == "extra_forbidden":
            known = ", ".join(sorted(ModelOverrides.model_fields))
            return f"unknown field {error['loc'][0]!r}; known fields: {known}"
        where, expected = first_problem(exc, ModelOverrides)
        if not where:
            return f'must be {expected}, like {{"num_kv_heads": 8}}'
        return f"{where} must be {expected}, got {error['input']!r}"
    return None


def check_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides given, checked (UsageError naming the field and the fix)."""
    problem = overrides_problem(dict(overrides))
    if problem is not None:
        raise UsageError(f"model_overrides: {problem}")
    return ModelOverrides.model_validate(dict(overrides)).model_dump(exclude_unset=True)
