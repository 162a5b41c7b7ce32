"""The verdict on a run: data -> rules -> words. ``diagnose(records)`` is a pure function from a run's
metrics records to findings, each with its name, the evidence (the numbers it read) and the one change it
suggests; the console, ``report.html`` and ``asyncrl diagnose`` only render them (docs/report.md lists every
rule, its thresholds and how to act on it).

Two kinds of findings:
- **bottlenecks** (:mod:`asyncrl.telemetry.bottlenecks`: where the time goes; at most one is *the* bottleneck,
  the one whose fix is expected to save the most step time, ``gain``): trainer-bound, generator-bound,
  tool-bound, sync-bound, eval/checkpoint-bound, reward-bound, long-tail-bound;
- **learning health** (:mod:`asyncrl.telemetry.health`): no learning signal, entropy collapse, clipping, the
  behaviour-weight cap, truncation, train/inference mismatch, staleness at its bound, held-out accuracy falling
  from its best; for SFT, memorising (training loss near zero while held-out accuracy stays low).

Rules read the last ``WINDOW`` training steps (the run as it ends, or as it is now), never the first (which waits
for the first batch whatever the settings), so a warm-up does not decide the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.telemetry.account import Account, account
from asyncrl.telemetry.bottlenecks import bottlenecks
from asyncrl.telemetry.findings import WINDOW, Finding, finite
from asyncrl.telemetry.health import health

__all__ = ["WINDOW", "Finding", "Verdict", "diagnose", "diagnose_sft"]

SFT_LOSS = 0.01  # an SFT loss this low...
SFT_ACCURACY = 0.2  # ...with held-out accuracy below this: memorised


@dataclass(frozen=True)
class Verdict:
    findings: list[Finding]
    account: Account
    settings: dict  # what the rules knew of the configuration (max_staleness, n_samples, ...)

    @property
    def bottleneck(self) -> Finding | None:
        found = [f for f in self.findings if f.kind == "bottleneck"]
        return max(found, key=lambda f: f.gain) if found else None

    def lines(self) -> list[str]:
        """A few lines for the console: the account, the bottleneck, then the other findings."""
        acc = self.account
        out = []
        if acc.steps:
            out.append(
                "time: trainer " + _shares(acc.fractions("trainer")) + " | generator " + _shares(acc.fractions("gen"))
            )
            if acc.positions_saved > 0:
                out.append(
                    f"trainer: {acc.positions / acc.steps:,.0f} positions computed a step for "
                    f"{acc.tokens / acc.steps:,.0f} tokens (shared prefixes computed once saved "
                    f"{acc.positions_saved:.0%})"
                )
        top = self.bottleneck
        if top:
            out.append(f"bottleneck: {top.line()}")
        elif not acc.steps:
            out.append(
                "bottleneck: not judged yet (the rules read the training steps after the first, which waits "
                "for the first batch whatever the settings)"
            )
        else:
            out.append("bottleneck: none found (neither side waits for the other much)")
        out += [f"{'also' if f.kind == 'bottleneck' else 'health'}: {f.line()}" for f in self.findings if f is not top]
        return out

    def to_dict(self) -> dict:
        top = self.bottleneck
        return {
            "bottleneck": top.name if top else None,
            "findings": [f.to_dict() for f in self.findings],
            "account": self.account.to_dict(),
            "settings": self.settings,
        }


def diagnose(records: list[dict], settings: dict | None = None) -> Verdict:
    """The verdict on a run's ``metrics.jsonl`` records (``settings``: ``max_staleness``, ``n_samples``,
    ``max_new_tokens``, ``workers`` as far as known)."""
    settings = dict(settings or {})
    steps = [r for r in records if r.get("step", 0) > 0]
    steps = steps[1:][-WINDOW:]  # the first step waits for the first batch whatever the settings: never read
    acc = account(steps)
    findings = bottlenecks(acc, steps, settings) + health(steps, records, settings)
    return Verdict(findings, acc, settings)


def diagnose_sft(records: list[dict]) -> Verdict:
    """The verdict on an SFT run's ``sft_metrics.jsonl``: memorising a small dataset."""
    findings = []
    evals = [r for r in records if finite(r.get("eval_accuracy")) is not None]
    tail = [r["loss"] for r in records[-WINDOW:] if finite(r.get("loss")) is not None]
    if evals and tail:
        loss, best = sum(tail) / len(tail), max(evals, key=lambda r: r["eval_accuracy"])
        last = evals[-1]["eval_accuracy"]
        if loss < SFT_LOSS and last < SFT_ACCURACY:
            findings.append(
                Finding(
                    "memorising",
                    "health",
                    f"training loss {loss:.4f} over the last {len(tail)} steps, held-out accuracy {last:.3f} (best "
                    f"{best['eval_accuracy']:.3f} at step {best['step']})",
                    f"the model learnt its {records[-1].get('examples', 'few')} examples by heart: give it more data, "
                    f"fewer steps, or start RL from the best held-out model (step {best['step']}: OUTPUT/best)",
                )
            )
    return Verdict(findings, Account(), {})


def _shares(fractions: dict[str, float]) -> str:
    shown = sorted(((p, f) for p, f in fractions.items() if f >= 0.01), key=lambda pf: -pf[1])
    return ", ".join(f"{p} {f:.0%}" for p, f in shown) or "-"
