"""Tiny frozen text encoders for tests: transformers models from configs a few layers deep and 32 wide,
with tokenizers made in memory, saved with save_pretrained (safetensors) so tests load them back through
`load_text_encoder` as they would a released one."""

import contextlib
import json
import os

WORDS = ("a an the one two three cat dog digit thin bold regular slanted upright left right red blue on of "
         "with small large photo").split()


@contextlib.contextmanager
def _quiet():
    """transformers' "Writing model shards" bar off while a helper saves."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def save_tiny_t5(folder, seed: int = 0, hidden: int = 32) -> str:
    """A random 2-layer T5 encoder (v1.1's gated-GELU, dropout 0.1 as released) with the byte-level
    ByT5 tokenizer; returns the folder."""
    import torch
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    tokenizer = ByT5Tokenizer()
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=hidden, d_kv=8, d_ff=2 * hidden, num_layers=2, num_heads=4,
                      feed_forward_proj="gated-gelu", dropout_rate=0.1)
    model = T5EncoderModel(config)
    model.set_input_embeddings(model.shared)  # one table, as released: see word_t5.save_word_t5
    with _quiet():
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _clip_vocab(folder) -> tuple:
    """vocab.json and merges.txt of a tiny CLIP BPE: the special tokens, WORDS whole, and single letters."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for word in WORDS:
        vocab[word + "</w>"] = len(vocab)
    for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!":
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    os.makedirs(folder, exist_ok=True)
    paths = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
    with open(paths[0], "w", encoding="utf-8") as f:
        json.dump(vocab, f)
    with open(paths[1], "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
    return paths, len(vocab)


def save_tiny_clip(folder, seed: int = 0, hidden: int = 32, positions: int = 16, projection: int = 24) -> str:
    """A random 2-layer CLIPTextModelWithProjection with a tiny BPE CLIPTokenizer; returns the folder."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    (vocab, merges), size = _clip_vocab(os.path.join(str(folder), "_vocab"))
    tokenizer = CLIPTokenizer(vocab, merges)
    torch.manual_seed(seed)
    config = CLIPTextConfig(vocab_size=size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=positions, projection_dim=projection,
                            bos_token_id=0, eos_token_id=1, pad_token_id=1)
    with _quiet():
        CLIPTextModelWithProjection(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def save_tiny_clip_model(folder, seed: int = 0, hidden: int = 32, image_size: int = 32, projection: int = 24) -> str:
    """A random 2-layer CLIPModel (text and vision towers with projections) with the tiny BPE tokenizer and a
    CLIP image processor at `image_size`: what CLIP score reads; returns the folder."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    (vocab, merges), size = _clip_vocab(os.path.join(str(folder), "_vocab"))
    torch.manual_seed(seed)
    text = dict(vocab_size=size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    vision = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                  image_size=image_size, patch_size=8)
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection)
    with _quiet():
        CLIPModel(config).save_pretrained(folder)
    CLIPTokenizer(vocab, merges).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
                       ).save_pretrained(folder)
    return str(folder)


def save_tiny_gemma2(folder, seed: int = 0, hidden: int = 32) -> str:
    """A random 2-layer Gemma 2 language model (saved whole, as released) with a word-level fast tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Gemma2Config, Gemma2ForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<bos>", "<unk>", *WORDS]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        bos_token="<bos>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = Gemma2Config(vocab_size=len(words), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0, eos_token_id=1,
                          bos_token_id=2)
    with _quiet():
        Gemma2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def write_captioned_folder(root, count: int = 6, seed: int = 0, nested: bool = False) -> list:
    """`count` random RGB images of varied sizes, each with NAME.txt beside it; returns (key, png bytes,
    caption) per image, sorted by key (as every layout lists them)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    items = []
    for i in range(count):
        key = f"{i // 3:03d}/{i:04d}" if nested else f"{i:04d}"
        arr = rng.integers(0, 256, (18 + 3 * i, 22 + i, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        caption = " ".join(WORDS[(k * i + k - 1) % len(WORDS)] for k in (1, 3, 5))  # distinct, in CLIP's tiny vocab
        path = os.path.join(str(root), *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".png", "wb") as f:
            f.write(buf.getvalue())
        with open(path + ".txt", "w", encoding="utf-8") as f:
            f.write(caption + "\n")
        items.append((key, buf.getvalue(), caption))
    return items


def tar_bytes(members) -> bytes:
    """An uncompressed tar of (name, bytes) members, in order; `name` may be anything (hostile tests)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def webdataset_members(items) -> list:
    """The (name, bytes) members of a webdataset shard of (key, png bytes, caption) items."""
    return [m for key, png, caption in items for m in ((f"{key}.png", png), (f"{key}.txt", caption.encode()))]


def save_tiny_pixart_run(folder, vae, text_encoder, seed: int = 0, std: float = 0.1,
                         name: str = "PixArt-alpha-XL/2-256", text_max_length=None, **options) -> str:
    """A checkpoint folder of a random tiny PixArt (2 blocks, 48 wide, 8x8x4 latents) whose captions are
    `text_encoder`'s (32 wide: the tiny T5's), decoded by `vae`, as `dit convert --to ours` writes one; every
    weight drawn N(0, std^2) so that no zero-initialised layer hides a mistake; `text_max_length` None leaves its
    captions' token count to the family's release length. Returns the folder."""
    import torch

    from dit_trainer.convert import Bundle, write
    from dit_trainer.convert.model_config import build_dit

    model = {"name": name, "input_size": 8, "in_channels": 4, "learn_sigma": True, "depth": 2, "hidden_size": 48,
             "num_heads": 2, "text_hidden_size": 32, **options}
    net = build_dit(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in net.named_parameters():
            if key != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=g) * std)
    bundle = Bundle(state_dict=net.state_dict(), model=model, vae=str(vae), scaling_factor=0.5,
                    text_encoder=str(text_encoder), text_max_length=text_max_length)
    return str(write("ours", bundle, folder))
