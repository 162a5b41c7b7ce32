import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TESTS = Path(__file__).resolve().parent
"""tests/: on the path of every test and of the processes they start (helpers, reward functions by name)."""
ROOT = TESTS.parent
"""The repository."""


@pytest.fixture(scope="session")
def tokenizer():
    from asyncrl.data.arith import ArithTask
    from asyncrl.data.tokenizer import build_tokenizer
    from asyncrl.models.hf import tokenizer_corpus

    return build_tokenizer(tokenizer_corpus(ArithTask(), n_problems=2000), vocab_size=512)


@pytest.fixture(scope="session")
def agent_tokenizer():
    """The lookup task's tokenizer (its chat template renders tools and tool calls)."""
    from asyncrl.data.lookup import LookupTask, build_agent_tokenizer

    return build_agent_tokenizer(LookupTask(), vocab_size=512, n_problems=2000)


@pytest.fixture(scope="session")
def two_trainer_ranks(tmp_path_factory):
    """The updates of two trainer ranks (DDP, FSDP2, LoRA under DDP) for every case the tests compare with one
    process: trainers_for_tests.two_trainer_ranks, spawned once per run instead of once per test. Under xdist the
    first worker to ask computes them (the other waits on a lock) and leaves them in the run's shared directory."""
    import fcntl
    import pickle

    from trainers_for_tests import two_trainer_ranks

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return two_trainer_ranks()
    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, above every worker's popen-gwK/
    path = shared / "two_trainer_ranks.pickle"
    with open(shared / "two_trainer_ranks.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            path.write_bytes(pickle.dumps(two_trainer_ranks()))
        return pickle.loads(path.read_bytes())


def make_model(vocab: int = 320, seed: int = 0, hidden: int = 64, layers: int = 2, model_type: str = "qwen2"):
    """A small random decoder of the given family."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if model_type == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**kw)).eval()


def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of ``output`` after ``prompt`` from one plain forward pass of ``model`` at ``temperature``."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1] / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


@pytest.fixture(scope="session")
def _tiny_model(tmp_path_factory, tokenizer):
    """The tiny model, built and saved once per session, and torch's RNG state right after it was built."""
    from asyncrl.models.hf import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128)
    rng = torch.get_rng_state()
    path = tmp_path_factory.mktemp("tiny-model") / "tiny"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, rng


@pytest.fixture
def tiny_model_dir(tmp_path, _tiny_model):
    """A randomly initialised tiny model with the task tokenizer, saved in HF format: a copy of the session's (the
    test may change its own), and torch's RNG as building it leaves it (seeded, then advanced by the init)."""
    import shutil

    source, rng = _tiny_model
    path = tmp_path / "tiny"
    shutil.copytree(source, path)
    torch.set_rng_state(rng)
    return str(path)


def pytest_collection_modifyitems(config, items):
    """Slow tests first, and first of them those with a longer timeout of their own (the longest runs), otherwise in
    order: with two workers (make test) the long end-to-end runs start at once and the many short tests fill in
    around them, instead of a long run starting last and leaving a worker idle."""

    def key(item):
        timeout = item.get_closest_marker("timeout")
        return item.get_closest_marker("slow") is None, -(timeout.args[0] if timeout and timeout.args else 0)

    items.sort(key=key)
