"""Workflows referenced by import path from tests, written as a user would: against the seam only."""

from asyncrl.types import Trajectory, TrajectoryGroup


class ShortAnswerWorkflow:
    """Samples n answers and rewards shorter ones (a user's own rule), ignoring the reward service."""

    runs = 0

    def __init__(self, context, bonus: float = 1.0):
        self.tokenizer, self.params, self.bonus = context.tokenizer, context.params, bonus

    async def run(self, item, engine):
        type(self).runs += 1
        completions = await engine.generate(item["prompt_ids"], self.params)
        return TrajectoryGroup(
            [
                Trajectory(
                    c.prompt_ids,
                    c.output_ids,
                    c.logprobs,
                    c.versions,
                    self.bonus / (1 + len(c.output_ids)),
                    c.finish_reason,
                )
                for c in completions
            ],
            item_id=item["id"],
        )


class RejectAll:
    async def run(self, item, engine):
        return None


reject_all = RejectAll()
