"""What the benchmarks print beside every figure: the CPU model, its widest vector extensions and its cores."""

from __future__ import annotations

import os
import platform
import subprocess


def cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor()
    model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in out.splitlines() if l.startswith("Flags")), [])
    wide = [f for f in flags if f.startswith(("avx512f", "avx2", "amx"))]
    return f"{model} ({' '.join(wide)}, {os.cpu_count()} cores)"
