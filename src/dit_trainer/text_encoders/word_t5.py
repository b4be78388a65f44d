"""A tiny T5 encoder over a word-level vocabulary, built in memory and saved as a transformers folder.

It stands in for T5-XXL where no download may happen (the text-conditioned digits demo): a
`T5Tokenizer` whose Unigram pieces are whole words ("▁seven"), so every word of the vocabulary is one
token and any other is `<unk>`, and a `T5EncoderModel` with random weights fixed by a seed, never
trained. Saved with `save_pretrained` (safetensors, tokenizer.json), it loads as a released T5 does:
through transformers' own `from_pretrained`, `load_text_encoder`, and diffusers' pipelines.
"""

import os
from typing import Sequence

# T5's own special pieces, at the ids a released T5 has them (pad 0, eos 1, unk 2).
SPECIAL = ("<pad>", "</s>", "<unk>")
META = "\u2581"  # SentencePiece's word-start mark


def word_tokenizer(words: Sequence[str]):
    """A `T5Tokenizer` whose vocabulary is T5's special pieces then `words`, each one token."""
    from transformers import T5Tokenizer

    words = list(dict.fromkeys(words))
    bad = [w for w in words if not w or any(c.isspace() for c in w)]
    if bad:
        raise ValueError(f"vocabulary words must be non-empty and hold no whitespace, got {bad[:3]}")
    # Equal scores: each piece is a whole word, so no segmentation is ever scored against another.
    vocab = [(p, 0.0) for p in SPECIAL] + [(META + w, -1.0) for w in words]
    return T5Tokenizer(vocab=vocab, extra_ids=0)


def save_word_t5(folder, words: Sequence[str], seed: int = 0, d_model: int = 64, num_layers: int = 2,
                 num_heads: int = 4, d_ff: int = 128) -> str:
    """Write a random T5 encoder (v1.1's gated-GELU; no dropout, as it is never trained) and its word-level
    tokenizer to `folder`, whole or not at all; returns the folder. The same arguments write the same weights
    on every machine (CPU draws)."""
    import torch
    from transformers import T5Config, T5EncoderModel

    from dit_trainer.fs import staged_folder
    from dit_trainer.text_encoders.encoder import _Quiet

    tokenizer = word_tokenizer(words)
    config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_kv=d_model // num_heads, d_ff=d_ff,
                      num_layers=num_layers, num_heads=num_heads, feed_forward_proj="gated-gelu",
                      dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    with torch.random.fork_rng(devices=[]):  # the caller's global RNG stream is left as it was
        torch.manual_seed(int(seed))
        model = T5EncoderModel(config).eval()
    # One embedding table, as a released T5 has: transformers ties it in its constructor, unless a load in another
    # thread has its tying swapped out at that moment (see pretrained_lock); then the folder would hold two tables.
    model.set_input_embeddings(model.shared)
    with staged_folder(os.fspath(folder), replace=True) as tmp, _Quiet():
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # a plain folder's mode, not the temporary folder's owner-only one
    return os.fspath(folder)
