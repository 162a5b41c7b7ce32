"""η as a policy: the max staleness the gate admits under (``rollout.max_head_offpolicyness``), fixed or tuned
online (``asyncrl.loop.staleness``)."""

from __future__ import annotations

from typing import Protocol


class StalenessPolicy(Protocol):
    """What the loop and the buffer ask of a policy. The buffer reads ``bound()`` once per version, when the
    version is set, so η is constant while that version admits, and the gate trains every group admitted at
    version v by version v + η(v), whatever η does next. The loop hands it each step's metrics record
    (``observe``); ``state``/``restore`` carry it across a resume (plain JSON values, in the checkpoint's run
    state)."""

    def bound(self) -> int: ...

    def observe(self, record: dict) -> None: ...

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...
