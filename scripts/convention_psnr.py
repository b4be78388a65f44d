"""What exporting to diffusers does to a trained model's samples: DDIM images of the model as
trained (the release's timestep embedding) vs the same weights under diffusers' convention
(frequencies over half - 1; the MLP eps travels as `norm_eps`), same noise and labels; PSNR.

    python scripts/convention_psnr.py RUN_OR_CHECKPOINT_DIR [--steps 25] [--cfg-scale 4] [--per-class 4]
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "convert"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--cfg-scale", type=float, default=4.0)
    p.add_argument("--per-class", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from dit_trainer.convert import read
    from dit_trainer.convert.model_config import build_dit
    from dit_trainer.convert.pipeline import DiTPipeline
    from dit_trainer.sample import default_classes, load_decoder, sample_latents, to_images

    pipe = DiTPipeline.from_pretrained(args.run)
    bundle = read("ours", args.run)
    shifted = {**bundle.model, "timestep_freq_shift": 1}
    other = build_dit(shifted)
    other.load_state_dict(bundle.state_dict)
    labels = [c for c in default_classes(pipe.model.num_classes) for _ in range(args.per_class)]
    decoder = load_decoder(pipe.cfg) if bundle.vae else (None, None, None)
    images = []
    for model in (pipe.model, other.eval()):
        z = sample_latents(model, pipe.cfg, labels, cfg_scale=args.cfg_scale, sampler="ddim", steps=args.steps,
                           seed=args.seed)
        images.append((to_images(z, *decoder) + 1) / 2)
    mse = torch.mean((images[0] - images[1]) ** 2, dim=(1, 2, 3))
    psnr = 10 * torch.log10(1 / mse.clamp_min(1e-12))
    print(f"{args.run}: {len(labels)} DDIM-{args.steps} samples, CFG {args.cfg_scale}: release vs diffusers' "
          f"timestep convention, PSNR mean {psnr.mean():.1f} dB (min {psnr.min():.1f}, max {psnr.max():.1f}); "
          f"max pixel difference {float((images[0] - images[1]).abs().max()):.3f}")
    return 0 if math.isfinite(float(psnr.mean())) else 1


if __name__ == "__main__":
    sys.exit(main())
