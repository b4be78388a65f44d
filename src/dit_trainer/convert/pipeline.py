"""A one-call pipeline in diffusers' manner over this project's sampler:

    pipe = DiTPipeline.from_pretrained("outputs/run")        # or a converted / DiTPipeline folder
    images = pipe(class_labels=["golden retriever", 360], num_inference_steps=25, guidance_scale=4.0)

    pipe = DiTPipeline.from_pretrained("outputs/pixart-run") # a text-to-image run, or a PixArt pipeline folder
    images = pipe(prompt=["a red cat"], negative_prompt="", num_inference_steps=25, guidance_scale=4.5)

It is thin: the folder is read by the converters, sampling is `dit_trainer.sample.sample_latents`
(`sample.prompts.sample_prompts` with the folder's text encoder for a text model), decoding
`load_decoder` + `to_images`.
"""

from pathlib import Path

import torch

from dit_trainer.errors import ConfigError


def _read_any(path, vae=None, model=None):
    from dit_trainer.convert import read

    root = Path(path)
    if (root / "model_index.json").is_file():
        if model is not None:
            raise ConfigError(f"{path} is a DiTPipeline folder whose transformer/config.json gives the model; drop model=")
        paddle = (root / "transformer" / "model_state.pdparams").is_file()
        return read("ppdiffusers" if paddle else "diffusers", root, vae=vae)
    if root.is_file():
        return read("dit-pt", root, model=model, vae=vae)
    return read("ours", root, model=model, vae=vae)


def _objective_of(path):
    """The objective of a run or checkpoint folder's config.yaml; None for any other path."""
    from dit_trainer import checkpoint

    root = Path(path)
    if root.is_file() or (root / "model_index.json").is_file():
        return None
    try:
        cfg = checkpoint.open(root).config()
    except Exception:  # not a run of ours: the readers below say what it is not
        return None
    return getattr(cfg, "objective", None)


def _seed_from(generator, shape) -> int:
    """The seed `sample_latents` draws the same starting noise from as diffusers does from `generator`.

    A fresh CPU generator's first normal draw is exactly the noise of its initial seed, so that seed
    is used; the generator is advanced by the draw, as diffusers advances it. Any other generator
    gives a seed drawn from it (same state, same images, but not diffusers' noise).
    """
    fresh = generator.device.type == "cpu" and torch.equal(
        generator.get_state(), torch.Generator().manual_seed(generator.initial_seed()).get_state())
    if fresh:
        seed = generator.initial_seed()
        torch.randn(shape, generator=generator)
        return seed
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))


class DiTPipeline:
    """Class-conditional sampling from a run folder, a converted folder or a DiTPipeline folder; text-to-image
    sampling (prompts) from a text model's run or converted folder or a PixArt pipeline folder."""

    def __init__(self, model, cfg, decoder=(None, None, None), class_names=None, device="cpu", text_encoder=None):
        self.model, self.cfg, self.decoder = model.eval(), cfg, decoder
        self.class_names = class_names
        self.device = torch.device(device)
        self.text_encoder = text_encoder  # a text model's frozen TextEncoder, None for class labels

    @classmethod
    def from_pretrained(cls, path, device="cpu", vae=None, model=None):
        """Load a run/checkpoint folder, a folder `dit convert` wrote, a diffusers or ppdiffusers
        DiTPipeline folder, or a released DiT .pt. `model`: a size name or model config file
        (PaddleMIX DiT JSON, our YAML) for a .pt whose size the tensors do not tell (default: read off them)."""
        from dit_trainer.class_names import imagenet_class_names
        from dit_trainer.config import build_config
        from dit_trainer.convert.model_config import CONVENTION_KEYS, build_dit
        from dit_trainer.sample import load_decoder

        if not Path(path).exists():
            raise ConfigError(f"{path} does not exist; pass a run folder, a converted folder or a DiTPipeline folder")
        if model is None and _objective_of(path) == "meanflow":  # no export format holds it: its run, as sampled
            from dit_trainer.sample.loading import load_model

            net, cfg = load_model(path)
            return cls(net.to(device), cfg, load_decoder(cfg, vae, device=device), None, device)
        bundle = _read_any(path, vae, model)
        model = build_dit(bundle.model)
        model.load_state_dict(bundle.state_dict, strict=True)
        model.to(device)
        cfg = build_config({
            "model": {k: v for k, v in bundle.model.items() if k not in CONVENTION_KEYS},
            "diffusion": dict(bundle.diffusion),
            "data": {"vae": bundle.vae, "scaling_factor": bundle.scaling_factor or 0.18215,
                     "latent_mean": bundle.latent_mean if bundle.vae else None,
                     "latent_std": bundle.latent_std if bundle.vae else None,
                     "text_encoder": bundle.text_encoder, "text_max_length": bundle.text_max_length or 0},
            **({"objective": "transport", "transport": bundle.transport} if bundle.transport is not None else {}),
        })
        decoder = (None, None, None)
        if bundle.vae:
            from dit_trainer.convert.hf_diffusers import quiet_diffusers

            with quiet_diffusers():
                decoder = load_decoder(cfg, device=device)
        names = bundle.class_names
        if names is None and model.num_classes == 1000:
            names = imagenet_class_names()
        encoder = None
        if "text_embeds" in getattr(model, "condition_keys", ()):
            from dit_trainer.sample.prompts import run_text_encoder

            encoder = run_text_encoder(cfg, device=device)
        return cls(model, cfg, decoder, names, device, encoder)

    def _defaults(self, steps, guidance_scale):
        """(steps, guidance scale) where not given: 25 and 4, or a MeanFlow run's own (its sample: steps or
        None for meanflow.steps, and its sample: cfg scale, 1 or the trained omega)."""
        if getattr(self.cfg, "objective", None) == "meanflow":
            sample = getattr(self.cfg, "sample", None)
            steps = steps if steps is not None else getattr(sample, "steps", None)
            scale = float(getattr(sample, "cfg_scale", None) or 1.0) if guidance_scale is None else guidance_scale
            return (None if steps is None else int(steps)), scale
        return int(25 if steps is None else steps), (4.0 if guidance_scale is None else guidance_scale)

    def _guide(self, guide):
        """The guide's model, checked against this pipeline's: a DiTPipeline, or a folder one loads from."""
        from dit_trainer.sample.run_settings import check_guide_fits

        if not isinstance(guide, DiTPipeline):
            guide = DiTPipeline.from_pretrained(guide, device=self.device)
        check_guide_fits(guide.cfg, guide.model, self.cfg, self.model, "guide")
        return guide.model.to(self.device)

    def _rows(self, class_labels, prompt, negative_prompt) -> list:
        """The class ids, or the prompts, to sample; a one-line error for what the model is not conditioned on."""
        if self.text_encoder is None:
            if prompt is not None or negative_prompt is not None:
                raise ConfigError("this model is class-conditional; pass class_labels=, not prompt= or negative_prompt=")
            if class_labels is None:
                raise ConfigError("pass class_labels=: ids or names of the classes to sample")
            return self.get_label_ids(class_labels)
        if class_labels is not None:
            raise ConfigError("this model is text-conditioned; pass prompt= (a string or a list), not class_labels=")
        from dit_trainer.sample.prompt_text import check_prompts

        return check_prompts(prompt)

    def get_label_ids(self, label):
        """Class ids for a name or a list of names (any synonym, case-insensitive), as diffusers' pipeline."""
        from dit_trainer.class_names import resolve_labels

        labels = [label] if isinstance(label, (str, int)) else list(label)
        return resolve_labels(labels, self.class_names, self.model.num_classes)

    @torch.no_grad()
    def __call__(self, class_labels=None, num_inference_steps=None, guidance_scale=None, generator=None, seed=None,
                 sampler=None, output_type="pil", progress=False, compile=False, guidance_interval=None, guide=None,
                 guide_scale=1.0, prompt=None, negative_prompt=None):
        """Images for `class_labels` (ids or names), or a text model's `prompt` (a string or a list, guided away
        from `negative_prompt`, default ""): a list of PIL images, or N×H×W×C floats in [0, 1].

        `sampler` defaults to the model's objective's: DDIM for diffusion, the ODE for transport (SiT), MeanFlow's
        for a MeanFlow run. `num_inference_steps` defaults to 25, `guidance_scale` to 4; a MeanFlow run samples
        in its `sample:` section's steps (else meanflow.steps, 1) and unguided (its guidance is trained in), or,
        where it trained over a range of scales (meanflow.omega_range), at `guidance_scale` inside that range.

        `guidance_interval=(sigma_lo, sigma_hi)` guides only where the noise level sigma lies in
        (sigma_lo, sigma_hi] (EDM's sigma; None: every step). `guide` (a DiTPipeline or a folder it loads
        from, of the same latent shape, classes and objective) with `guide_scale` w > 1 is autoguidance:
        D_guide + w (D - D_guide), on top of `guidance_scale` (1: autoguidance alone).

        `compile=True` compiles the model's forward on the first call (about a minute), for many calls.
        """
        from dit_trainer.sample import sample_latents, to_images, to_uint8

        if output_type not in ("pil", "np"):
            raise ConfigError(f"output_type {output_type!r} is not 'pil' or 'np'")
        num_inference_steps, guidance_scale = self._defaults(num_inference_steps, guidance_scale)
        guide_model = self._guide(guide) if guide is not None and float(guide_scale) != 1.0 else None
        rows = self._rows(class_labels, prompt, negative_prompt)
        if generator is not None:
            size = self.model.input_size
            seed = _seed_from(generator, (len(rows), self.model.in_channels, size, size))
        kw = dict(cfg_scale=guidance_scale, sampler=sampler, steps=num_inference_steps, seed=int(seed or 0),
                  device=self.device, progress=progress, compile=compile, guidance_interval=guidance_interval,
                  guide=guide_model, guide_scale=float(guide_scale))
        if self.text_encoder is None:
            samples = sample_latents(self.model, self.cfg, rows, **kw)
        else:
            from dit_trainer.sample.prompts import sample_prompts

            samples = sample_prompts(self.model, self.cfg, None, self.text_encoder, rows,
                                     negative_prompt=negative_prompt, image_size=self.cfg.data.image_size, **kw)
        images = to_images(samples, *self.decoder).cpu()
        if output_type == "np":
            return ((images + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).numpy()
        from PIL import Image

        arr = to_uint8(images)
        return [Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a) for a in arr]
