"""CLIP score: how well images match their captions, by a CLIP model the user supplies as a local folder.

The convention is torchmetrics' `CLIPScore` (Hessel et al. 2021, CLIPScore, with w = 100 as the
text-to-image papers report it): per pair, 100 · max(cos(E_image, E_text), 0) of the model's projected
image and text embeddings, averaged over the pairs. Images are prepared by the folder's CLIP image
processor (resize, center crop, normalise), captions by its tokenizer, cut at the model's positions.

Only a local folder is read (a transformers `CLIPModel` saved with save_pretrained: config.json,
safetensors weights, the tokenizer's files and preprocessor_config.json), nothing executed: a name
that is not a folder is refused in one line, since scores from a model fetched behind the user's back
would not be comparable with anyone's.
"""

import os

import numpy as np
import torch

from dit_trainer.errors import ConfigError, DataError, one_line
from dit_trainer.pretrained_lock import PRETRAINED_LOCK

SCALE = 100.0  # torchmetrics' and the papers' w


class ClipScorer:
    """A frozen CLIP model with its processor: `scores(images, captions)` → per-pair CLIP scores."""

    def __init__(self, model, tokenizer, image_processor, device):
        model.requires_grad_(False)
        self.model = model.eval().to(device)
        self.tokenizer, self.image_processor, self.device = tokenizer, image_processor, torch.device(device)
        self.max_length = int(model.config.text_config.max_position_embeddings)

    @torch.no_grad()
    def embed_images(self, images: np.ndarray) -> torch.Tensor:
        """(N, P) unit-norm projected embeddings of uint8 N×H×W×3 images."""
        pixels = self.image_processor(images=list(np.asarray(images)), return_tensors="pt")["pixel_values"]
        out = self.model.get_image_features(pixel_values=pixels.to(self.device))
        out = getattr(out, "pooler_output", out)  # transformers 5 returns an output object
        return torch.nn.functional.normalize(out.float(), dim=-1)

    @torch.no_grad()
    def embed_texts(self, captions) -> torch.Tensor:
        """(N, P) unit-norm projected embeddings of `captions`."""
        enc = self.tokenizer(list(captions), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt")
        out = self.model.get_text_features(input_ids=enc["input_ids"].to(self.device),
                                           attention_mask=enc["attention_mask"].to(self.device))
        out = getattr(out, "pooler_output", out)
        return torch.nn.functional.normalize(out.float(), dim=-1)

    def scores(self, images: np.ndarray, captions) -> np.ndarray:
        """(N,) float64 100 · max(cos, 0) of image i and caption i."""
        if len(images) != len(captions):
            raise ValueError(f"{len(images)} images for {len(captions)} captions")
        cos = (self.embed_images(images) * self.embed_texts(captions)).sum(-1)
        return (SCALE * cos.clamp(min=0)).double().cpu().numpy()


def clip_score(scorer: ClipScorer, images: np.ndarray, captions) -> float:
    """The mean CLIP score of images and their captions (torchmetrics' CLIPScore)."""
    return float(scorer.scores(images, captions).mean())


def load_clip(folder, device="cpu") -> ClipScorer:
    """A `ClipScorer` of the CLIPModel saved in local folder `folder`; anything else is one line."""
    name = os.fspath(folder)
    path = os.path.expanduser(name)
    if not os.path.isdir(path):
        raise ConfigError(f"eval.clip_model {name} is not a folder; CLIP score reads a local transformers CLIPModel "
                          "folder only (e.g. `hf download openai/clip-vit-large-patch14 --local-dir DIR` on a connected "
                          "machine, then pass DIR)")
    from dit_trainer.text_encoders.folders import check_safe

    config = check_safe(path, path)  # no code of the folder's own, safetensors weights only
    if config.get("model_type") != "clip":
        raise DataError(f"{path}/config.json describes a {config.get('model_type')!r} model; CLIP score needs a "
                        "CLIPModel (model_type clip: text and vision towers with projections)")
    if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        raise DataError(f"{path} holds no preprocessor_config.json (the CLIP image processor); save it beside the model "
                        "(CLIPImageProcessor.save_pretrained(DIR))")
    try:
        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel
    except ImportError:
        raise DataError("CLIP score needs transformers; pip install dit-trainer[text]") from None
    try:
        with PRETRAINED_LOCK:
            model = CLIPModel.from_pretrained(path, use_safetensors=True, local_files_only=True, trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
            processor = CLIPImageProcessor.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"cannot load the CLIP model in {path} ({one_line(err)}); re-save it with save_pretrained") from None
    return ClipScorer(model.float(), tokenizer, processor, device)
