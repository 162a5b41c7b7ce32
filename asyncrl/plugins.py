"""Objects named in config by import path (``package.module:name``): reward functions, workflows.

Import strings live in config files only; this is the one place that turns them into objects."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def _with_working_directory() -> None:
    """Modules in the working directory import as under ``python -m`` (the ``asyncrl`` script alone would not
    see them): it is appended to ``sys.path``, after everything installed."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def load_object(spec: str) -> Any:
    """Import ``package.module:name`` (``name`` may be dotted, e.g. ``module:Class.method``); the
    ``ValueError`` names what is missing."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"'{spec}' must look like package.module:name")
    _with_working_directory()
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"'{spec}': cannot import module '{module_name}' ({e}); searched the working directory "
            f"{os.getcwd()} and the Python path: run from the directory that holds it, or add that directory "
            "to PYTHONPATH"
        ) from e
    except SyntaxError as e:
        raise ValueError(
            f"'{spec}': module '{module_name}' has a syntax error at {e.filename}:{e.lineno} ({e.msg})"
        ) from e
    except Exception as e:  # noqa: BLE001 - the module itself raised while being imported
        raise ValueError(f"'{spec}': importing module '{module_name}' raised {type(e).__name__}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"'{spec}': module '{module_name}' has no '{attr}'")
        obj = getattr(obj, part)
    return obj
