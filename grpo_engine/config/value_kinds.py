"""The Python types a setting's annotation admits at its top level: what the flags read a value as, and whether a
blank text is the setting's own kind of mistake (a text setting's) or a value of another type."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal


def value_kinds(annotation: Any) -> set[type]:
    """The Python types `annotation` admits at its top level (Annotated and Union unwrapped)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return value_kinds(typing.get_args(annotation)[0])
    if origin is Literal:
        return {type(value) for value in typing.get_args(annotation)}
    if origin in (typing.Union, types.UnionType):
        return set().union(*(value_kinds(arg) for arg in typing.get_args(annotation)))
    if annotation is None or annotation is type(None):
        return {type(None)}
    return {origin or annotation}
