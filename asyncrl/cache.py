"""asyncrl's own cache directory: what can be made again but is slow to make (matplotlib's font cache, the
text of ``--help-config``). Nothing in it is ever needed: a cache that cannot be written is skipped."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/asyncrl``, else ``~/.cache/asyncrl``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "asyncrl"


def writable_dir(name: str) -> Path | None:
    """``cache_dir()/name``, created; None where it cannot be (a read-only or missing home)."""
    try:
        path = cache_dir() / name
        path.mkdir(parents=True, exist_ok=True)
        return path if os.access(path, os.W_OK) else None
    except (OSError, RuntimeError):
        return None


def source_key(root: Path = Path(__file__).parent) -> str:
    """A digest of the package's source files (path, size, modification time) and Python's version: what a
    cached text made from the source depends on."""
    digest = hashlib.sha256(sys.version.encode())
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        digest.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def write_atomically(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file and a rename (two processes may write it at once)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
