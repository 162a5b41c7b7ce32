"""Supervised fine-tuning: loss on the target tokens only, on a built-in task or on the user's own data.

The examples come from the sources ``asyncrl train`` reads (``train_dataset.*``: the built-in task, a JSONL /
JSON / Parquet file or saved ``datasets`` directory with the same row formats and field mapping, a gym task):

- prompt + response: the item's ``question`` as one user turn under the chat template, then its target, the
  ``solution`` (GSM8K / MATH / qa rows; a ``response`` column is read as one), else the ``answer`` text, and
  the end-of-turn token; loss on the target. A row with neither (code without a solution) has nothing to
  train on: skipped and counted in ``sft_skipped_no_target``.
- chat (rows with ``messages``): the chat template renders the whole conversation once; loss on the assistant
  turns only, each its content plus the end-of-turn token (:func:`chat_example`).
- agentic built-in tasks (``lookup``: items carry a ``transcript``): whole multi-turn conversations, tokenised
  exactly as the agent proxy sends them at RL time (:func:`asyncrl.agent.tasks.transcripts.transcript_ids`),
  evaluated by running the task's episode function (:mod:`asyncrl.agent.tasks.evaluate`;
  :mod:`asyncrl.commands.sft.agent`).

Examples longer than ``max_length`` are skipped and counted (``sft_skipped_long``; :mod:`.examples`). A step's
loss is the mean over its target tokens, computed in micro-batches of at most ``MICRO_BATCH_TOKENS`` positions,
packed side by side (``pack``; :mod:`asyncrl.trainer.packing`) or padded: the same number either way
(:mod:`.loss`). The command itself is :mod:`.run`.
Held-out answers are scored by ``reward.fn`` or the data's own verifier. ``OUTPUT/sft_metrics.jsonl`` holds a
record per step; checkpoints go to ``OUTPUT`` at the end, ``OUTPUT/stepN`` every ``saver.freq_steps`` steps and
``OUTPUT/best`` at each evaluation better than those before (with ``model.lora``: the adapter, and the merged model
in ``merged/`` beside it; see :mod:`asyncrl.models.lora`); a step checkpoint also holds ``sft_state.pt`` (trained
weights, optimizer, data position, RNG), from which the same command resumes a stopped run (``resume=auto``,
:mod:`asyncrl.commands.sft.state`) with the losses it would have had. The training stream is seeded by ``seed``
(``train_dataset.seed`` is not used) and steps take ``train_dataset.batch_size`` examples."""
