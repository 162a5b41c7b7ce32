"""A mixture of sources: the streams of several datasets interleaved by weight, each item tagged with the name
of its ``source``, which picks its reward function (:class:`asyncrl.reward.base.MixtureReward`)."""

from __future__ import annotations

import bisect
import hashlib
import itertools
from typing import Callable, Iterator

from asyncrl.configlib import ConfigError
from asyncrl.data.datasets import Dataset, prompt_key
from asyncrl.data.rows import MAX_SKIPS_IN_A_ROW


class MixtureSchedule:
    """Which source each position of a mixture's stream draws from: a weighted choice made from a hash of
    (``seed``, position), so any position's source is known without replaying the stream (a resumed run, the
    metrics of a trained item id) and the same seed always gives the same interleave."""

    def __init__(self, names: list[str], weights: list[float], seed: int):
        total = sum(weights)
        self.names, self.seed = list(names), seed
        self.bounds = list(itertools.accumulate(w / total for w in weights))

    def index(self, position: int) -> int:
        digest = hashlib.blake2b(f"{self.seed}:{position}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2.0**64  # uniform in [0, 1)
        return min(bisect.bisect_right(self.bounds, u), len(self.names) - 1)

    def __call__(self, item_id) -> str | None:
        """The source of the training item ``item_id`` (its position in the stream); None for anything else."""
        if isinstance(item_id, bool) or not isinstance(item_id, int) or item_id < 0:
            return None
        return self.names[self.index(item_id)]


def mixture_dataset(
    sources: dict[str, tuple[float, Dataset]], *, seed: int = 0, reward_fn: Callable[..., float] | None = None
) -> Dataset:
    """One dataset from several: position i of the stream comes from a source chosen by weight
    (:class:`MixtureSchedule`), items are renumbered by position (ids stay unique integers, as the rollout
    seeds need) and tagged with their ``source`` (a row's own ``source`` column becomes ``row_source``); the
    held-out list is the union of the sources', each item tagged too. ``sources`` maps a name to (weight > 0,
    dataset); ``reward_fn`` is the mixture's reward (by default each item is scored by its source's own
    verifier). The counters are summed (``data_epoch``: the largest) and given per source as
    ``KEY/NAME``. Drawing the first n items always gives the same items, so a resumed run that skips the
    items it drew continues where it stopped."""
    if not sources:
        raise ConfigError("train_dataset.mixture: no sources")
    names = list(sources)
    schedule = MixtureSchedule(names, [w for w, _ in sources.values()], seed)
    streams = [data.train for _, data in sources.values()]
    valid, held = [], set()  # the sources' held-out items, each prompt once (one file in two entries: once)
    for name, (_, data) in sources.items():
        for item in data.valid:
            key = prompt_key(item)
            if key not in held:
                held.add(key)
                valid.append(_tagged(item, name))

    def unheld(k: int) -> dict:
        """Source k's next item whose prompt no source holds out (another entry may read the same data)."""
        for _ in range(MAX_SKIPS_IN_A_ROW):
            item = next(streams[k])
            if prompt_key(item) not in held:
                return item
        raise ConfigError(
            f"train_dataset.mixture: source '{names[k]}' yields only prompts that the mixture holds "
            f"out ({MAX_SKIPS_IN_A_ROW} in a row)"
        )

    def interleaved() -> Iterator[dict]:
        for position in itertools.count():
            k = schedule.index(position)
            yield {**_tagged(unheld(k), names[k]), "id": position}

    def stats() -> dict:
        per_source = {name: data.stats() for name, (_, data) in sources.items()}
        out = {"data_bad_rows": 0, "data_skipped_long": 0, "data_epoch": 0}
        for name, counters in per_source.items():
            for key, value in counters.items():
                out[key] = max(out.get(key, 0), value) if key == "data_epoch" else out.get(key, 0) + value
                out[f"{key}/{name}"] = value
        return out

    if reward_fn is None:
        from asyncrl.reward.base import MixtureReward, SourceReward

        reward_fn = MixtureReward({name: SourceReward(data.reward_fn) for name, (_, data) in sources.items()})
    return Dataset(interleaved(), valid, reward_fn, stats, schedule)


def _tagged(item: dict, source: str) -> dict:
    """``item`` with its mixture ``source``; a row's own ``source`` column is kept as ``row_source``."""
    if "source" in item:
        item = {**item, "row_source": item["source"]}
    return {**item, "source": source}


def split_sizes(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders), at least 1 each."""
    shares = [total * w / sum(weights) for w in weights]
    sizes = [int(s) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: sizes[i] - shares[i])[: total - sum(sizes)]:
        sizes[i] += 1
    return [max(1, n) for n in sizes]
