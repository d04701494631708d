"""Typed, strict parameter schemas: an unknown or mistyped parameter is an error naming its key.

Every top-level key of the Kedro ``parameters`` is owned by one schema, listed in
:data:`prorag.pipelines.parameter_schemas.PARAMETER_SCHEMAS`. Nodes annotate their ``params:<namespace>`` argument
with the schema, so Kedro (1.7+) instantiates and validates it; :func:`validate_parameters` checks the whole tree,
including top-level keys no node reads (the project hook calls it before a run). Schemas are strict: no
coercion (``true`` is not an int, ``"3"`` is not a number), so a mistyped value is an error, not a surprise.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from prorag.errors import UserError

Dtype = Literal["float32", "bfloat16", "float16"]
MixedPrecision = Annotated[Literal["no", "bf16"], BeforeValidator(lambda value: "no" if value is False else value)]
"""``bf16``: compute in bf16 under autocast over the weights' dtype (:mod:`prorag.llm.precision`); YAML reads a bare
``no`` (``--params sft.mixed_precision=no``) as false, which means ``no`` here."""
PositiveInt = Annotated[int, Field(ge=1)]
Seed = Annotated[int, Field(ge=0)]
"""Field types shared by every schema (also exported by :mod:`prorag.specs`)."""

ModelT = TypeVar("ModelT", bound=BaseModel)

PARAMETER_SCHEMAS: dict[str, type[BaseModel]] = {}
"""Schemas registered with :func:`register_parameters` (prefer a line in ``prorag.pipelines.parameter_schemas``)."""


class StrictModel(BaseModel):
    """Base for parameter schemas: unknown keys are rejected, values are validated, nothing is coerced silently."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ParameterError(UserError, ValueError):
    """Parameters do not match their schema; the message lists every offending dotted key."""


def register_parameters(namespace: str) -> Callable[[type[ModelT]], type[ModelT]]:
    """Class decorator: the schema owns ``parameters[namespace]``."""

    def decorate(schema: type[ModelT]) -> type[ModelT]:
        existing = PARAMETER_SCHEMAS.get(namespace)
        if existing is not None and existing.__qualname__ != schema.__qualname__:
            raise ValueError(f"parameter namespace {namespace!r} is already owned by {existing.__qualname__}")
        PARAMETER_SCHEMAS[namespace] = schema
        return schema

    return decorate


def parse_parameters(schema: type[ModelT], values: Mapping[str, Any] | None, namespace: str) -> ModelT:
    """Validate one namespace; errors name keys as ``namespace.key.subkey``.

    A polymorphic schema (one with a ``schema_for(values)`` classmethod, such as the reward settings, whose ``kind``
    picks the class) is validated, and its errors described, by the class the values name."""
    try:
        concrete = schema.schema_for(values or {}) if hasattr(schema, "schema_for") else schema
    except ValueError as error:
        raise ParameterError(f"parameter {namespace!r}: {error}") from None
    try:
        return concrete.model_validate(dict(values or {}))
    except ValidationError as error:
        raise ParameterError(_describe(error, namespace, concrete)) from None


def validate_parameters(parameters: Mapping[str, Any],
                        schemas: Mapping[str, type[BaseModel]] | None = None) -> dict[str, BaseModel]:
    """Validate the whole parameter tree against ``schemas`` (default: the registered ones): unknown top-level
    keys and schema violations are all reported."""
    schemas = PARAMETER_SCHEMAS if schemas is None else schemas
    problems: list[str] = []
    parsed: dict[str, BaseModel] = {}
    for namespace, values in parameters.items():
        schema = schemas.get(namespace)
        if schema is None:
            known = ", ".join(sorted(schemas)) or "none"
            problems.append(f"unknown parameter key {namespace!r}{_did_you_mean(namespace, schemas)} "
                            f"(known top-level keys: {known})")
            continue
        values = _plain(values)  # blocks Kedro's typed-parameter validation already instantiated, at any depth
        if not isinstance(values, Mapping):
            problems.append(f"parameter {namespace!r} must be a mapping, got {type(values).__name__}")
            continue
        try:
            parsed[namespace] = parse_parameters(schema, values, namespace)
        except ParameterError as error:
            problems.append(str(error))
    if len(problems) == 1:
        raise ParameterError(f"invalid parameters: {problems[0]}")
    if problems:
        raise ParameterError(f"{len(problems)} invalid parameters:\n  " + "\n  ".join(problems))
    return parsed


def _plain(value: Any) -> Any:
    """``value`` with every pydantic model in it (at any depth: ``methods.<name>.reward``) dumped to a mapping."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _did_you_mean(key: str, valid: Collection[str], prefix: str = "") -> str:
    """``"; did you mean '<prefix><closest>'?"`` when one of ``valid`` is close to ``key``, else ``""``."""
    close = difflib.get_close_matches(key, [str(name) for name in valid], n=1, cutoff=0.6)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold, through ``Optional``, unions, ``Annotated``, lists and dicts."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in get_args(annotation) for model in _models_in(argument)]


def _keys_at(schema: type[BaseModel], location: Sequence[str | int]) -> set[str]:
    """The valid keys of the mapping at ``location`` inside ``schema`` (empty when it is not a model's)."""
    models = [schema]
    for part in location:
        if isinstance(part, int):  # a list index: the item is of the same model(s)
            continue
        inner = [found for model in models if part in model.model_fields
                 for found in _models_in(model.model_fields[part].annotation)]
        named = [model for model in models if model.__name__ == part]  # a union member's tag
        models = inner or named or models  # neither: a dict key, the values are of the same model(s)
    return {key for model in models for key in model.model_fields}


def _describe(error: ValidationError, namespace: str, schema: type[BaseModel]) -> str:
    lines = []
    for item in error.errors():
        key = ".".join([namespace, *(str(part) for part in item["loc"])])
        if item["type"] == "extra_forbidden":
            parent, unknown = key.rsplit(".", 1)
            valid = _keys_at(schema, item["loc"][:-1])
            hint = _did_you_mean(unknown, valid, parent + ".")
            if not hint and valid:
                hint = f" (valid keys of {parent!r}: {', '.join(sorted(valid))})"
            lines.append(f"unknown parameter key {key!r}{hint}")
        else:  # a block's own check (its input is the whole block) names what is wrong: no echo of the block
            given = item.get("input")
            lines.append(f"parameter {key!r}: {item['msg']}" + ("" if isinstance(given, Mapping) else
                                                                   f" (got {given!r})"))
    return "; ".join(lines)
