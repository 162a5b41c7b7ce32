"""Workflows turn one dataset item into a trajectory group by talking to an engine."""
