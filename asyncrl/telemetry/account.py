"""Where a run's time went, side by side: the trainer thread, the generator, the episodes, the rewards.

Every step's record (``metrics.jsonl``) carries the seconds of the step's window (from the previous record to
this one, ``step_time_s``) spent in each phase, under ``<side>_<phase>_s``:

- trainer (``TRAINER``): ``wait`` for a batch, ``recompute`` (the no-grad passes: proximal and reference
  log-probs, values), ``fwd_bwd`` (forward and backward passes), ``optim`` (clipping and the optimizer step),
  ``sync`` (publishing the weights), ``eval``, ``save``, ``other`` (the rest of the train span: collation,
  advantages; and the ``log`` spans: building, logging and checking the step's record);
- generator (``GENERATOR``): ``decode``, ``prefill``, ``reprefill`` (after an interruption by new weights),
  ``paused`` (held for a weight update), ``idle_gate`` (idle while the staleness gate kept work out),
  ``idle_nowork`` (idle with the gate open: nothing admitted needs the engine, e.g. episodes in their tools),
  ``other``;
- episodes (``EPISODES``, agent workflows; episode-seconds, summed over episodes that ended in the window):
  ``llm_queue`` and ``llm_gen`` (a call waiting for an engine slot, and generating), ``proxy`` (the proxy's own
  work: templates, tokenising, parsing), ``http`` (between the client and the proxy), ``tool`` (everything
  else: tools and the agent's own code);
- rewards (``REWARD``; call-seconds): ``queue`` (waiting for a worker) and ``run``.

Beside the seconds, the trainer's work: ``train_tokens`` trained and the positions its forward passes computed for
them (fewer where samples share a prefix, computed once: ``prefix_shared_frac``, ``actor.shared_prefix``).

The trainer's phases are each measured and their sum stays within 2% of ``step_time_s`` over a run (what is
left is time between the trainer's spans); the generator's ``other`` is what its counters did not claim. This module
reads records only: ``asyncrl.telemetry.verdict`` reasons on its accounts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TRAINER = ("wait", "recompute", "fwd_bwd", "optim", "sync", "eval", "save", "other")
GENERATOR = ("decode", "prefill", "reprefill", "paused", "idle_gate", "idle_nowork", "other")
EPISODES = ("llm_queue", "llm_gen", "proxy", "http", "tool")
REWARD = ("queue", "run")
SIDES = {"trainer": TRAINER, "gen": GENERATOR, "episode": EPISODES, "reward": REWARD}
"""Each side's phases; the record key of a phase is ``f"{side}_{phase}_s"``."""


def key(side: str, phase: str) -> str:
    return f"{side}_{phase}_s"


@dataclass
class Account:
    """Seconds per phase of each side over some steps, and the wall time they cover."""

    wall_s: float = 0.0
    steps: int = 0
    tokens: float = 0.0  # tokens trained
    positions: float = 0.0  # positions computed for them (a shared prefix once)
    seconds: dict[str, dict[str, float]] = field(
        default_factory=lambda: {s: dict.fromkeys(p, 0.0) for s, p in SIDES.items()}
    )

    def add(self, record: dict) -> None:
        self.wall_s += _num(record.get("step_time_s"))
        self.steps += 1
        self.tokens += _num(record.get("train_tokens"))
        self.positions += positions_computed(record)
        for side, phases in SIDES.items():
            for phase in phases:
                self.seconds[side][phase] += _num(record.get(key(side, phase)))

    def fractions(self, side: str) -> dict[str, float]:
        """Each phase of ``side`` as a fraction of the wall time (trainer, generator) or of the side's total
        (episodes, rewards, whose seconds are summed over many at once)."""
        total = self.wall_s if side in ("trainer", "gen") else sum(self.seconds[side].values())
        return {p: (s / total if total > 0 else 0.0) for p, s in self.seconds[side].items()}

    def measured(self, side: str) -> bool:
        """Whether any record carried this side's phases (a run of an older version, or without episodes,
        has none)."""
        return any(v > 0 for v in self.seconds[side].values())

    @property
    def positions_saved(self) -> float:
        """The share of trained tokens whose positions were not computed again (shared prefixes)."""
        return 1.0 - self.positions / self.tokens if self.tokens > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "steps": self.steps,
            "tokens": self.tokens,
            "positions": self.positions,
            "positions_saved": self.positions_saved,
            **{side: {"seconds": dict(self.seconds[side]), "fractions": self.fractions(side)} for side in SIDES},
        }


def account(records: list[dict]) -> Account:
    """The account of the training steps among ``records`` (the step-0 evaluation is not one)."""
    acc = Account()
    for r in records:
        if r.get("step", 0) > 0:
            acc.add(r)
    return acc


def positions_computed(record: dict) -> float:
    """The positions a step's forward passes computed: its tokens, less those of prefixes shared and computed once
    (``actor.shared_prefix``)."""
    return _num(record.get("train_tokens")) * (1.0 - _num(record.get("prefix_shared_frac")))


def _num(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value) if value == value and abs(value) != float("inf") else 0.0
