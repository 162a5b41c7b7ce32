"""Built-in agentic tasks: problems a model can only solve with its tools, each with an episode function
written against the OpenAI client interface (``async def episode(client, item, **options) -> float``).

- :mod:`asyncrl.agent.tasks.lookup`: the tools and the episode of the lookup task (:mod:`asyncrl.data.lookup`:
  questions about made-up entities whose numbers only the ``lookup`` tool knows, combined arithmetically;
  ``task.name: lookup`` / ``train_dataset.path: builtin:lookup``), with an optional ``python`` tool run in the
  reward sandbox;
- :mod:`asyncrl.agent.tasks.transcripts`: reference transcripts as the token ids the proxy would send (SFT);
- :mod:`asyncrl.agent.tasks.evaluate`: held-out accuracy of an agent task, by running its episodes.
"""
