"""Config problems as a user can act on them: a near-miss key gets its likely meaning."""

from __future__ import annotations

import difflib

from pydantic import BaseModel

_UNKNOWN = ": unknown key"


def with_hint(problem: str) -> str:
    """`scrape_intervall: unknown key` -> `...; did you mean scrape_interval?`."""
    from exporter.config.model import Config

    if not problem.endswith(_UNKNOWN):
        return problem
    path = problem.removesuffix(_UNKNOWN).split(".")
    model: type[BaseModel] | None = Config
    for part in path[:-1]:  # down the nested models (a list index keeps the model)
        if part.isdigit() or model is None:
            continue
        field = model.model_fields.get(part)
        model = _model_of(field.annotation) if field is not None else None
    if model is None:
        return problem
    near = difflib.get_close_matches(path[-1], list(model.model_fields), n=1, cutoff=0.8)
    return f"{problem}; did you mean {near[0]}?" if near else problem


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):  # list[TargetConfig], X | None
        if (found := _model_of(arg)) is not None:
            return found
    return None
