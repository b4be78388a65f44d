"""Frozen text encoders for text-to-image training, through transformers: T5 (v1.1, XXL), CLIP with
projection (CLIP-L, CLIP-G) and Gemma 2 (its decoder's hidden states, as Sana reads them), from a
save_pretrained folder, a diffusers pipeline folder (`text_encoder/` + `tokenizer/`) or a Hugging Face
id. Nothing in a folder is executed: safetensors weights only, no `trust_remote_code`.

`load_text_encoder(name)` → `TextEncoder`, whose `encode(captions)` gives the batch keys a text
dataset yields (`text_embeds`, `text_mask`, and `text_pooled` for CLIP). Names load on first use, so
reading a config imports neither torch nor transformers."""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "TextEncoder": "encoder", "load_text_encoder": "encoder", "text_dtype_for": "encoder",
    "resolve_folders": "folders", "copy_text_encoder": "folders", "shard_text_encoder": "parallelize",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
