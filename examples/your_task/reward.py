"""The walk-through task's reward (docs/your-task.md): 1.0 when the completion lists the row's words in
alphabetical order, else 0.0. Named in config as ``reward.fn=examples.your_task.reward:sorted_words``.

A reward function takes the prompt, the decoded completion and the row's fields as keyword arguments (here
``answer``), and returns a float; it runs in a reward worker process, with a time limit.
"""


def sorted_words(prompt: str, completion: str, answer: str, **_) -> float:
    return float(completion.split() == answer.split())
