"""Checkpoints of a run: ``RUN_DIR/checkpoints/stepN/`` in Hugging Face format (plus the critic), and
``checkpoints/latest`` naming the newest."""

from __future__ import annotations

from pathlib import Path


class Checkpointer:
    def __init__(self, run_dir: Path, trainer, tokenizer):
        self.dir, self.trainer, self.tokenizer = Path(run_dir) / "checkpoints", trainer, tokenizer
        self.last: int | None = None  # the version saved last

    def save(self, version: int) -> Path:
        """Write the weights of ``version`` (refused if any is NaN or inf) and point ``latest`` at them."""
        path = self.dir / f"step{version}"
        self.trainer.save(str(path), self.tokenizer)
        (self.dir / "latest").write_text(path.name + "\n")
        self.last = version
        return path
