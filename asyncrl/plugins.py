"""Objects named in config by import path (``package.module:name``): reward functions, workflows.

Import strings live in config files only; this is the one place that turns them into objects."""

from __future__ import annotations

import importlib
from typing import Any


def load_object(spec: str) -> Any:
    """Import ``package.module:name`` (``name`` may be dotted, e.g. ``module:Class.method``); the
    ``ValueError`` names what is missing."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"'{spec}' must look like package.module:name")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"'{spec}': cannot import module '{module_name}' ({e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"'{spec}': module '{module_name}' has no '{attr}'")
        obj = getattr(obj, part)
    return obj
