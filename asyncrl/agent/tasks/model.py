"""The tiny agent model's starting point: a tiny model for a new tokenizer, optionally warm-started from another
checkpoint of the same shape (``asyncrl init-model --task lookup --init-from builtin:tiny-sft``).

A warm start copies every weight but the token embeddings and the output head from the source, and, for
the tokens both vocabularies share (the same string: digits, `` +``, `` =``, ``The``, `` answer``, ...), their
rows of those two; the other tokens keep their fresh initialisation. The arithmetic checkpoint's working
(``62 + 78 = 140``) tokenises the same under the agent tokenizer, so the agent model starts out able to add.
"""

from __future__ import annotations

import torch


def transplant(model, tokenizer, source, source_tokenizer) -> int:
    """Copy ``source``'s weights into ``model`` (same shape but the vocabulary) as described above; returns the
    number of shared tokens whose embedding and output rows were copied. ValueError if the shapes differ."""
    target_state, source_state = model.state_dict(), source.state_dict()
    vocab_keys = {"model.embed_tokens.weight", "lm_head.weight"}
    for name, tensor in target_state.items():
        if name in vocab_keys:
            continue
        if name not in source_state or source_state[name].shape != tensor.shape:
            raise ValueError(
                f"cannot warm-start: the source model has no weight {name} of shape "
                f"{tuple(tensor.shape)} (give a source of the same shape)"
            )
    old = source_tokenizer.get_vocab()
    pairs = [(i, old[token]) for token, i in tokenizer.get_vocab().items() if token in old]
    with torch.no_grad():
        for name, tensor in target_state.items():
            if name in vocab_keys:
                src = source_state[name]
                for new_id, old_id in pairs:
                    if new_id < tensor.shape[0] and old_id < src.shape[0]:
                        tensor[new_id] = src[old_id]
            else:
                tensor.copy_(source_state[name])
    model.load_state_dict(target_state)
    return len(pairs)
