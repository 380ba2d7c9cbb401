"""Strict YAML: a file's top-level mapping, loaded safely (no object construction) and with duplicated
keys refused, which PyYAML's own loaders silently let the last one win."""

from __future__ import annotations

from pathlib import Path

import yaml

__all__ = ["load_yaml"]


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicated mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ValueError(f"duplicated key {key!r} in YAML (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path) -> dict:
    """Load a YAML mapping safely (no object construction) and strictly (no duplicated keys).

    Args:
        path: the YAML file.

    Returns:
        Its top-level mapping ({} for an empty file).

    Raises:
        ValueError: the file cannot be read, is not YAML, holds a duplicated key, or is not a mapping.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"config {str(path)!r}: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data
