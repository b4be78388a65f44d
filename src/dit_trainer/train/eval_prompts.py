"""FID over a prompt set, for a text-conditioned model: `eval.num_samples` samples of its held-out
captions' encodings (each caption as often as the others, in a seeded order), against the statistics
of those captions' own images (their latents decoded as the samples are), with the existing
evaluator's networks; and with `eval.clip_model` (a local CLIP folder) the CLIP score of each sample
against its caption's text (torchmetrics' convention, `evaluate.clip_score`).

Chunk c always draws the same captions with the same seed, so successive measurements differ by the
model only, as the class-conditional FID's do. The reference has as many images as captions are held
out (64 by default): a small sample's FID is biased upward, comparable across steps and runs of one
held-out set, not with published numbers (set `eval.ref` for a reference of its own).
"""

import hashlib

import numpy as np
import torch

from dit_trainer.errors import ConfigError, DataError


def _uint8_rgb(images) -> np.ndarray:
    from dit_trainer.sample import to_uint8

    x = to_uint8(images)
    return np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x


class PromptSet:
    """The held-out rows FID samples (`features`) and their images' statistics (`reference`)."""

    def __init__(self, cfg, condition, held, device, clip=None):
        self.cfg, self.condition, self.held, self.device, self.clip = cfg, condition, held, device, clip

    @classmethod
    def for_run(cls, cfg, condition, held, device):
        """The prompt set of a condition that samples rows (None for class labels); one line for what is missing."""
        if condition is None or not condition.grid_from_rows:
            if cfg.eval.clip_model and condition is not None:
                raise ConfigError(f"eval.clip_model scores samples against their captions, and {cfg.model.name} is "
                                  f"conditioned on {condition.name} labels; leave eval.clip_model unset")
            return None
        if held is None:
            raise ConfigError(f"eval.every {cfg.eval.every}: FID of a text-conditioned model samples held-out captions, "
                              "and the run holds none; hold some out (data.val_split, data.val_path)")
        if len(held) < 2:
            raise DataError(f"eval.every {cfg.eval.every}: {held.source} is {len(held)} sample; FID's reference needs "
                            "at least 2 held-out images")
        clip = None
        if cfg.eval.clip_model:
            if held.captions is None:
                raise ConfigError(f"eval.clip_model needs the held-out captions' text, and {held.source} keeps only "
                                  "their encodings (dit extract's shards); train from the captioned folder "
                                  "(data.text_encoder) or set data.val_path to a captioned folder")
            from dit_trainer.evaluate.clip_score import load_clip

            clip = load_clip(cfg.eval.clip_model, device)
        return cls(cfg, condition, held, device, clip)

    def source(self) -> dict:
        """What the reference depends on: the held-out latents themselves and the VAE decoding them."""
        from dit_trainer.sample.decode import vae_source

        vae = vae_source(self.cfg)
        digest = hashlib.sha256(self.held.x.contiguous().numpy().tobytes()).hexdigest()
        return {"data": self.held.source, "held_out": len(self.held), "sha256": digest, "vae": vae and vae[0]}

    def _decoder(self):
        from dit_trainer.sample import load_decoder

        return load_decoder(self.cfg, device=self.device)

    def reference(self, network, network_name):
        """The held-out images' statistics under `network`."""
        from dit_trainer.evaluate.features import extract_features
        from dit_trainer.evaluate.stats import ReferenceStats
        from dit_trainer.sample import to_images

        decoder, batch = self._decoder(), self.cfg.eval.sample_batch_size

        def images():
            for start in range(0, len(self.held), batch):
                x = self.held.x[start:start + batch].to(self.device)
                yield _uint8_rgb(to_images(x, *decoder, strict=False))

        feats = extract_features(network, images(), batch, device=self.device, progress=False, total=len(self.held))
        return ReferenceStats.from_features(feats, network_name)

    def features(self, network, model, objective, chunks, amp_dtype):
        """(Features, per-sample CLIP scores or None) of `model`'s samples in `chunks`; (None, None) for none."""
        from dit_trainer.evaluate.features import Features, iter_features
        from dit_trainer.sample import to_images
        from dit_trainer.sample.fid_batch import chunk_labels, chunk_seed
        from dit_trainer.sample.sampling import sample_conditioned

        ev, seed = self.cfg.eval, self.cfg.train.seed
        rows = chunk_labels(ev.num_samples, len(self.held), seed)  # each caption equally often, seeded order
        decoder, device = self._decoder(), self.device
        amp = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
        scores = []

        def images():
            for c in chunks:
                index = rows[c * ev.sample_batch_size:(c + 1) * ev.sample_batch_size]
                cond = {k: v.to(device) for k, v in self.held.take(index)[1].items()}
                with amp:
                    latents = sample_conditioned(model, objective, self.condition, cond, cfg_scale=ev.cfg_scale,
                                                 steps=ev.sample_steps, seed=chunk_seed(seed, c), device=device)
                x = _uint8_rgb(to_images(latents.float(), *decoder, strict=False))
                if self.clip is not None:
                    scores.append(self.clip.scores(x, [self.held.captions[i] for i in index]))
                yield x

        parts = list(iter_features(network, images(), ev.sample_batch_size, device=device, progress=False))
        if not parts:
            return None, None
        feats = Features(*(np.concatenate([getattr(f, k) for f in parts]) for k in ("pool", "spatial", "logits")))
        return feats, (np.concatenate(scores) if scores else None)
