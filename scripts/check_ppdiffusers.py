"""Load our ppdiffusers export with ppdiffusers' own DiTPipeline and compare its transformer with ours.

Run in the venv scripts/ppdiffusers_env.sh builds (paddle and ppdiffusers, no torch needed):
    VENV/bin/python scripts/check_ppdiffusers.py --export OUT_PP --reference ref.npz
where ref.npz holds x, t, y and our model's output under diffusers' timestep convention
(`python scripts/check_ppdiffusers.py --make-reference ...` writes it from the main environment).
Prints the relative difference and get_label_ids(["golden retriever"]); exits 1 past --tol.
"""

import argparse
import sys

import numpy as np


def make_reference(args) -> int:
    """Main environment: export a random DiT to ppdiffusers and save our output on fixed inputs."""
    import torch

    sys.path.insert(0, "tests/convert")
    from convert_helpers import randomize

    from dit_trainer.convert import Bundle, write
    from dit_trainer.convert.model_config import DIFFUSERS_CONVENTION, build_dit

    cfg = {"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 1000, "depth": 2,
           "hidden_size": 64, "num_heads": 2}
    model = randomize(build_dit(cfg)).eval()
    write("ppdiffusers", Bundle(state_dict=model.state_dict(), model=cfg, vae=args.vae, scaling_factor=0.18215),
          args.export)
    conv = {**cfg, **DIFFUSERS_CONVENTION}
    ours = build_dit(conv)
    ours.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(0)
    x, t, y = torch.randn(4, 4, 8, 8, generator=g), torch.tensor([0, 250, 600, 999]), torch.tensor([207, 1, 360, 1000])
    with torch.no_grad():
        out = ours.eval()(x, t, y)
    np.savez(args.reference, x=x.numpy(), t=t.numpy(), y=y.numpy(), out=out.numpy())
    print(f"wrote {args.export} and {args.reference}")
    return 0


def check(args) -> int:
    """ppdiffusers environment: load the folder with DiTPipeline and compare."""
    import paddle
    from ppdiffusers import DiTPipeline

    pipe = DiTPipeline.from_pretrained(args.export)
    ref = np.load(args.reference)
    with paddle.no_grad():
        out = pipe.transformer(paddle.to_tensor(ref["x"]), timestep=paddle.to_tensor(ref["t"]),
                               class_labels=paddle.to_tensor(ref["y"])).sample.numpy()
    rel = float(np.linalg.norm(out - ref["out"]) / np.linalg.norm(ref["out"]))
    ids = pipe.get_label_ids(["golden retriever"])
    print(f"ppdiffusers transformer vs ours (diffusers' convention): relative difference {rel:.2e}")
    print(f"get_label_ids(['golden retriever']) = {ids}")
    images = pipe(class_labels=[207], num_inference_steps=2, output_type="np").images
    print(f"pipeline ran: images {images.shape}")
    return 0 if rel < args.tol and ids == [207] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--export", required=True, help="the ppdiffusers folder (written with --make-reference)")
    p.add_argument("--reference", required=True, help=".npz of inputs and our output")
    p.add_argument("--make-reference", action="store_true", help="main environment: write the export and the .npz")
    p.add_argument("--vae", help="diffusers VAE folder for --make-reference")
    p.add_argument("--tol", type=float, default=1e-4)
    args = p.parse_args()
    return make_reference(args) if args.make_reference else check(args)


if __name__ == "__main__":
    sys.exit(main())
