"""Tasks and datasets: where prompts, held-out items and their default reward function come from.

An item is a dict with at least ``question`` (the user turn) and whatever fields its reward function takes
as keyword arguments (e.g. ``answer``, ``tests``); ``solution`` (a reference answer text) is used by SFT.
Training items also carry a unique ``id``.

- :mod:`.datasets`: a run's ``Dataset`` from a built-in task, a file or a reasoning-gym task; held-out splits;
- :mod:`.mixture`: several sources interleaved by weight, each item tagged with its ``source``;
- :mod:`.rows`: rows of a file to items, bad rows and over-long prompts skipped and counted;
- :mod:`.sources`: reading JSONL / JSON / Parquet files and saved ``datasets`` directories;
- :mod:`.formats`: the row formats (GSM8K, MATH, code, chat rows, prompt ids) and prompt templates;
- :mod:`.arith`, :mod:`.lookup`: the built-in tasks; :mod:`.gym`: reasoning-gym tasks;
- :mod:`.chat`: message normalisation; :mod:`.tokenizer`: building a tokenizer for a new domain;
- :mod:`.collate`: trajectory groups to a padded training ``Batch``;
- :mod:`.config`: the dataset config sections, mapped onto the functions above.
"""
