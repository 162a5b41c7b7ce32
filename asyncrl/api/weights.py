"""The weight seams: how the trainer's new weights reach the engines (``Publisher``), and what the broadcast
transport needs from an engine of remote servers (``ServerFleet``). Every transport is time-bounded and raises
``WeightSyncError`` naming the version it was delivering."""

from __future__ import annotations

import contextlib
from typing import Protocol


class WeightSyncError(RuntimeError):
    """A weight update that was not delivered (the message names the version)."""


class Publisher(Protocol):
    def publish(self, state_dict: dict, version: int) -> float:
        """Deliver ``state_dict`` as ``version`` to every engine; return the seconds it took."""
        ...

    def close(self) -> None:
        """Release what the transport holds (files, process groups)."""
        ...


class ServerFleet(Protocol):
    """What the broadcast transport needs from an engine beyond the ``Engine`` seam: its live servers, a
    control request to one of them, and the pause/raise-version bracket around a transfer
    (``asyncrl.engine.remote.RemoteEngine`` has these)."""

    def live_addrs(self) -> list[str]: ...

    def post(self, url: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict: ...

    def updating(self, version: int, timeout: float) -> contextlib.AbstractContextManager[list[str]]: ...
