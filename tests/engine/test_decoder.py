"""The decoder (asyncrl.engine.decoder) and the sampler on another device than the host."""

import torch

from asyncrl.types import SamplingParams

from conftest import make_model

VOCAB = 320


def test_decoder_and_sampler_run_on_another_device():
    """The decoder and the sampler on a device other than the CPU, checked here with "meta" (shapes, no data):
    every tensor is made there, the native kernels (CPU code) are off, and prefill, decode, a weight update
    from a host state dict and each kind of sampling run without a host tensor meeting a device one (which
    raises "Tensor on device cpu is not on the expected device meta")."""
    from asyncrl.engine.decoder import Decoder
    from asyncrl.engine.sampling import RowParams, sample_rows

    d = Decoder(make_model(VOCAB), 4, 40, device="meta")
    assert d.kernels is None and not d.packed and d.device == torch.device("meta")
    tensors = [d.kv_cache, d.rotation, d.head_scale, d.logits, d.w.embed, d.w.norm, d.w.lm_head]
    tensors += [t for layer in d.w.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    assert all(t.device.type == "meta" for t in tensors)
    lengths, zeros = torch.tensor([5, 9, 1, 7]), torch.zeros(4, dtype=torch.long)
    logits = d.forward(torch.randint(0, VOCAB, (4, 9)), 0, zeros, lengths)  # prefill, padded
    assert logits.device.type == "meta" and logits.shape == (4, VOCAB)
    d.install(d.prepare(make_model(VOCAB, seed=1).state_dict()))
    assert all(t.device.type == "meta" for layer in d.w.layers for t in (layer.wqkv, layer.wd))
    d.copy_slot(0, range(1, 3), 5)
    logits = d.forward(torch.randint(0, VOCAB, (4, 1)), 0, lengths, torch.ones(4, dtype=torch.long))  # decode
    large = torch.empty(4, 9000, device="meta")  # above 4096 entries the sampler's inverse CDF has two levels
    for logits in (logits, large):
        scratch = torch.empty(logits.shape, device="meta")
        for params in (
            [SamplingParams(greedy=True)] * 4,
            [SamplingParams(temperature=0.7)] * 4,
            [SamplingParams(greedy=True), SamplingParams(top_p=0.9, top_k=5)] * 2,
        ):
            rows = RowParams.of(params, "meta")
            assert rows.temperature.device.type == rows.greedy.device.type == "meta"
            tokens, logprobs = sample_rows(logits.clone(), rows, None, scratch)
            assert tokens.device.type == logprobs.device.type == "meta" and tokens.shape == (4,)
