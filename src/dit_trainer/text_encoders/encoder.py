"""`TextEncoder`: a frozen transformers text encoder with its tokenizer, encoding captions as the
text-to-image releases do.

Every caption is padded to `max_length` tokens (PixArt's `padding="max_length"`, so embeddings of
one encoder always have one shape and can be cached in fixed-size shards) and truncated past it
(counted in `truncated`, for the log). T5 and Gemma 2 see the attention mask; CLIP is called without
it, as diffusers' SD3 pipelines call it: its attention is causal, so the caption's tokens never see
the padding either way, and the pooled projection is read at the end-of-text token.
"""

import types
from typing import Dict, Optional, Sequence

import torch

from dit_trainer.errors import DataError, one_line
from dit_trainer.pretrained_lock import PRETRAINED_LOCK
from dit_trainer.text_encoders.folders import resolve_folders

# config.json's model_type -> (kind, the release's token count: PixArt-alpha's 120 for T5, Sana's 300
# for Gemma 2; None: CLIP's position table, 77)
KINDS = {"t5": ("t5", 120), "clip_text_model": ("clip", None), "clip": ("clip", None), "gemma2": ("gemma2", 300)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def text_dtype_for(dtype: str, device_type: str) -> str:
    """data.text_dtype made concrete: auto is bf16 on a GPU, fp32 elsewhere."""
    if dtype == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    if dtype not in DTYPES:
        raise DataError(f"text encoder dtype {dtype!r} is not one of auto, fp32, bf16 (fp16 overflows in T5)")
    return dtype


def _stay_eval(module, mode: bool = True):
    """`train()` of a frozen encoder: eval whatever is asked (T5's dropout would change its outputs)."""
    return torch.nn.Module.train(module, False)


class TextEncoder:
    """A frozen, eval-mode text encoder: `encode(captions)` → {"text_embeds" (B, L, D), "text_mask" (B, L)
    int64, "text_pooled" (B, P) for CLIP}, on the encoder's device in its dtype.

    Attributes: `name` (Hub id or absolute folder, as recorded), `folder` and `tokenizer_folder` (local
    folders, for export), `kind` (t5 | clip | gemma2), `max_length`, `hidden_size`, `pooled_size`
    (None without a pooled output), `model`, `tokenizer`, `truncated` (captions cut so far), `group`."""

    def __init__(self, model, tokenizer, kind: str, name: str, folder: str, tokenizer_folder: str, max_length: int):
        model.requires_grad_(False)
        model.train = types.MethodType(_stay_eval, model)
        self.model = model.train(False)
        self.tokenizer, self.kind, self.name = tokenizer, kind, name
        self.folder, self.tokenizer_folder = folder, tokenizer_folder
        self.max_length = int(max_length)
        config = model.config
        self.hidden_size = int(config.hidden_size)
        self.pooled_size = int(config.projection_dim) if kind == "clip" else None
        self.truncated = 0
        self.group = None  # sharded (`parallelize`): the process group its forward is a collective over

    @property
    def device(self) -> torch.device:
        """Where the encoder's weights are."""
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The encoder's compute dtype."""
        return next(self.model.parameters()).dtype

    def to(self, device) -> "TextEncoder":
        """Move the encoder to `device` (in place); returns itself."""
        self.model.to(device)
        return self

    def identity(self) -> Dict:
        """What a manifest records of the encoder: its outputs depend on exactly these."""
        return {"name": self.name, "kind": self.kind, "max_length": self.max_length,
                "dtype": str(self.dtype).replace("torch.", ""), "hidden_size": self.hidden_size,
                "pooled_size": self.pooled_size}

    def count_truncated(self, captions: Sequence[str]) -> int:
        """How many of `captions` run past `max_length` tokens."""
        # verbose=False: the untruncated pass would warn about every long caption.
        lengths = self.tokenizer(list(captions), add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        return sum(len(ids) > self.max_length for ids in lengths)

    def tokenize(self, captions: Sequence[str]):
        """(input ids, attention mask) (B, max_length) int64, each caption cut at max_length."""
        enc = self.tokenizer(list(captions), padding="max_length", max_length=self.max_length, truncation=True,
                             add_special_tokens=True, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"].long()

    @torch.no_grad()
    def encode(self, captions: Sequence[str], pad_to: Optional[int] = None) -> Dict[str, torch.Tensor]:
        """The batch keys for `captions` (leading dim len(captions)); adds the captions cut to `truncated`.
        `pad_to`: run the encoder on a batch of exactly that many (copies of the first caption fill it),
        so a caption encodes to the same bytes whatever else is in its batch (see `data.encode`)."""
        captions = list(captions)
        if not captions or not all(isinstance(c, str) for c in captions):
            raise TypeError("captions must be a non-empty list of strings")
        self.truncated += self.count_truncated(captions)
        b = len(captions)
        if pad_to is not None and b < pad_to:
            captions = captions + [captions[0]] * (pad_to - b)
        ids, mask = self.tokenize(captions)
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self.kind == "clip":
            out = self.model(input_ids=ids)
            batch = {"text_embeds": out.last_hidden_state, "text_mask": mask, "text_pooled": out.text_embeds}
        else:
            out = self.model(input_ids=ids, attention_mask=mask)
            batch = {"text_embeds": out.last_hidden_state, "text_mask": mask}
        return {k: v[:b] for k, v in batch.items()}


def _model_class(kind: str):
    import transformers

    return {"t5": transformers.T5EncoderModel, "clip": transformers.CLIPTextModelWithProjection,
            "gemma2": transformers.Gemma2Model}[kind]


def _max_length(kind: str, default: Optional[int], config: dict, asked: Optional[int], where: str) -> int:
    positions = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    length = int(asked) if asked else (default or positions)
    if positions and length > positions:
        raise DataError(f"max length {length} is more than the {positions} positions of the text encoder in {where}; "
                        f"set data.text_max_length (--text-max-length) to {positions} or less")
    return length


class _Quiet:
    """transformers' per-load progress bars off while loading (they would interleave with ours)."""

    def __enter__(self):
        from transformers.utils import logging

        self.was = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()

    def __exit__(self, *exc):
        from transformers.utils import logging

        if self.was:
            logging.enable_progress_bar()


def load_text_encoder(name_or_path, dtype: str = "auto", device="cpu", max_length: Optional[int] = None) -> TextEncoder:
    """A frozen, eval-mode `TextEncoder` from a folder or Hub id (see `folders`), in `dtype` (auto | fp32 |
    bf16) on `device`; `max_length` None or 0 takes the release's (T5 120, Gemma 2 300, CLIP 77)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise DataError("text encoders need transformers; pip install dit-trainer[text]") from None
    device = torch.device(device)
    torch_dtype = DTYPES[text_dtype_for(dtype, device.type)]
    name, folder, tok_folder, config = resolve_folders(name_or_path)
    model_type = config.get("model_type")
    if model_type not in KINDS:
        raise DataError(f"{folder}/config.json describes a {model_type!r} model; dit-trainer reads T5, CLIP (with "
                        "projection) and Gemma 2 text encoders")
    kind, default = KINDS[model_type]
    length = _max_length(kind, default, config, max_length, folder)
    from transformers import AutoTokenizer

    try:
        with _Quiet(), PRETRAINED_LOCK:
            tokenizer = AutoTokenizer.from_pretrained(tok_folder, local_files_only=True, trust_remote_code=False)
            model, info = _model_class(kind).from_pretrained(folder, dtype=torch_dtype, use_safetensors=True,
                                                             local_files_only=True, trust_remote_code=False,
                                                             output_loading_info=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"cannot load the text encoder in {folder} ({one_line(err)}); re-save it with save_pretrained") from None
    if info.get("missing_keys"):  # transformers would fill them with random numbers: every caption encoded wrong
        missing = sorted(info["missing_keys"])
        raise DataError(f"the text encoder in {folder} lacks {len(missing)} weight(s) its config.json asks for "
                        f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); re-save it with "
                        "save_pretrained from a complete model")
    tokenizer.padding_side = "right"  # Sana sets it for Gemma; T5's and CLIP's already are
    return TextEncoder(model.to(device), tokenizer, kind, name, folder, tok_folder, length)
