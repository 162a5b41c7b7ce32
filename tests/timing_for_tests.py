"""Timing bounds that hold on a loaded machine: a test that tells a hang from an answer by the clock bounds the time
by what it allows on a quiet machine, scaled by how oversubscribed the cores are now (CI shares its machine; a
first-week user's `make test-fast` at a load of 5-8 on 2 cores failed three such bounds that pass alone)."""

import os


def loaded(seconds: float) -> float:
    """``seconds`` times the 1-minute load average per core, when that is above 1."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        load = 1.0
    return seconds * max(1.0, load)
