"""The contracts: the Protocols that the loop, the launcher and the servers see their parts through, and the
plain data that crosses them. Implementations import these, never one another's modules for a type.

- ``engine``: ``Engine`` (generate, update_weights, version), ``Lifecycle``, ``InlineGenerating``, ``EngineStats``;
- ``workflow``: ``Workflow`` and its optional capabilities (``Closable``, ``Counted``, ``Evaluating``),
  ``WorkflowContext``, and the built-in tasks' ``Task`` / ``AgenticTask``;
- ``trainer``: ``Trainer`` (what the loop drives), ``Checkpointable`` and ``Snapshots`` (what a checkpoint takes);
- ``weights``: ``Publisher`` (new weights to the engines), ``ServerFleet``, ``WeightSyncError``;
- ``staleness``: ``StalenessPolicy`` (η, fixed or tuned);
- ``reward``: ``Scorer`` (what workflows score with), ``Described``.

The data types every layer shares (``SamplingParams``, ``Completion``, ``Trajectory``, ``TrajectoryGroup``,
``Batch``, ``WeightUpdate``) are in :mod:`asyncrl.types`.
"""
