"""Input files and settings checked by pydantic models, with errors as one line for humans.

A model's field descriptions say what each field must be ("a non-negative integer"); the first
validation error becomes ``where must be what`` with that description, so the expected form is
written once, where it is checked. Used for NVML recordings and ``model_overrides``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pydantic import ValidationError

#: Pydantic error types whose own wording is more precise than a field's description.
_BY_ERROR_TYPE: Final = {
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "dict_type": "a JSON object",
    "finite_number": "a finite number",
}


def first_problem(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    custom: Mapping[str, tuple[str, str]] | None = None,
) -> tuple[str, str]:
    """``(where, expected)`` for the first error of ``exc`` raised by ``model``.

    ``where`` is the field's path (``samples[0].gpus[1].uuid``, empty for the whole document);
    ``expected`` is the field's description, with the value given for enum and literal fields.
    ``custom`` maps an error type raised by a model validator to ``(field, expected)``.
    """
    error = exc.errors(include_url=False)[0]
    loc = tuple(error["loc"])
    kind = error["type"]
    if custom and kind in custom:
        field, expected = custom[kind]
        loc = (*loc, field)
    else:
        expected = _BY_ERROR_TYPE.get(kind) or field_description(model, loc) or error["msg"]
    if kind in ("enum", "literal_error"):
        expected = f"{expected} (got {error['input']!r})"
    return path_text(loc), expected


def field_description(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The description of the field at ``loc``, walking nested models and list items."""
    current: type[BaseModel] | None = model
    description = None
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        description = field.description
        current = _model_in(field.annotation)
    return description


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: directly, in a list, or beside ``None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def path_text(loc: tuple[int | str, ...]) -> str:
    """``samples[0].gpus[1].uuid`` for ``("samples", 0, "gpus", 1, "uuid")``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
