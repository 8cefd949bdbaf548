"""The settings of two kinds the schema declares by their types: paths (PathSetting) and lists."""

from __future__ import annotations

import typing

from grpo_engine.config import leaf_fields
from grpo_engine.config.schema import PathSetting


def _admits_list(annotation: typing.Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_admits_list(arg) for arg in typing.get_args(annotation))


def _marked_path(annotation: typing.Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        if any(isinstance(item, PathSetting) for item in annotation.__metadata__):
            return True
    return any(_marked_path(arg) for arg in typing.get_args(annotation))


def _is_path(field) -> bool:
    return any(isinstance(item, PathSetting) for item in field.metadata) or _marked_path(field.annotation)


def path_keys() -> list[str]:
    return sorted(key for key, field in leaf_fields().items() if _is_path(field))


def list_keys() -> list[str]:
    return sorted(key for key, field in leaf_fields().items() if _admits_list(field.annotation))
