"""asyncrl: fully asynchronous reinforcement learning for LLM reasoning, end to end on a CPU."""

__version__ = "0.1.0"
