"""Launching a run: ``build`` assembles a config into the parts of a run (``assemble``), ``placement`` parses
``rollout.backend``/``actor.backend`` into an allocation of devices, ``ranks`` runs several trainer ranks, and
``ray`` (the only module that imports ray) places them on a Ray cluster."""
