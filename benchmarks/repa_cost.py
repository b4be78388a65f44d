"""What REPA adds to a training step: `DiTTrainer.train_step` with repa.enabled (the frozen encoder on
the batch's images, the projector, the alignment term) beside the same trainer without it, fed the
same in-memory batches, alternating step by step in one process.

    python benchmarks/repa_cost.py                                   # SiT-S/2 on 32x32x4 latents, DINOv2-S/14 and B/14
    python benchmarks/repa_cost.py --model SiT-B/2 --encoders dinov2_vitb14 --batch-size 8 --steps 4
    python benchmarks/repa_cost.py --device cuda --model SiT-XL/2 --batch-size 128 --mixed-precision bf16 \
        --encoders dinov2_vitb14 --ac                                 # what gpu_check.sh runs

The encoders have random weights of the real architecture (the cost does not depend on the values).
The encoder's input is the size whose patch grid is the model's token grid (224 px for /2 on 32x32
latents). Besides the measured times, the table gives the FLOPs each part costs per image:
the model's training FLOPs (forward + backward), the projector's (forward + backward) and the
encoder's (forward only, under no_grad).
"""

import argparse
import statistics
import sys
import tempfile
import time

import torch

from _common import machine, sync


def _config(args, out, encoder=None):
    cfg = {
        "output_dir": out, "model": {"name": args.model, "input_size": args.input_size, "in_channels": 4,
                                     "num_classes": 1000, "learn_sigma": False},
        "data": {"num_workers": 0},
        "train": {"global_batch_size": args.batch_size, "device": args.device, "mixed_precision": args.mixed_precision,
                  "compile": "false", "activation_checkpointing": "full" if args.ac else "none"},
        "logging": {"progress": False, "tensorboard": False},
    }
    if encoder:
        cfg["repa"] = {"enabled": True, "encoder": encoder, "encoder_weights": "random"}
    return cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="SiT-S/2")
    ap.add_argument("--input-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--encoders", default="dinov2_vits14,dinov2_vitb14")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mixed-precision", default="fp32")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ac", action="store_true", help="full activation checkpointing in every variant (big models "
                                                       "at big batches: the trainers are alive together)")
    args = ap.parse_args(argv)

    from dit_trainer.encoders import encoder_flops, encoder_param_count
    from dit_trainer.models.flops import train_flops_per_image
    from dit_trainer.train import DiTTrainer

    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    side = args.input_size * 8
    batches = [{"x": torch.randn(args.batch_size, 4, args.input_size, args.input_size, generator=g),
                "y": torch.randint(0, 1000, (args.batch_size,), generator=g),
                "image": torch.randint(0, 256, (args.batch_size, 3, side, side), dtype=torch.uint8, generator=g)}
               for _ in range(2)]
    variants = {"off": None, **{name: name for name in args.encoders.split(",") if name}}
    trainers = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, encoder in variants.items():
            torch.manual_seed(0)
            trainers[label] = DiTTrainer(_config(args, f"{tmp}/{label}", encoder))
        times = {label: [] for label in trainers}
        for step in range(args.warmup + args.steps):
            for label, trainer in trainers.items():  # alternating: the machine's drift hits every variant alike
                batch = batches[step % 2]
                sync(device)
                t0 = time.perf_counter()
                trainer.train_step(batch if label != "off" else (batch["x"], batch["y"]))
                sync(device)
                if step >= args.warmup:
                    times[label].append(time.perf_counter() - t0)
    base = statistics.median(times["off"])
    model = trainers["off"].model
    model_flops = train_flops_per_image(model)
    print(f"# {machine(device)}; torch {torch.__version__}")
    print(f"# {args.model} on {args.input_size}x{args.input_size}x4 latents ({side} px), batch {args.batch_size}, "
          f"{args.mixed_precision}{', full AC' if args.ac else ''}; median of {args.steps} steps after {args.warmup} warm-up, variants alternating")
    print(f"# command: python benchmarks/repa_cost.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print("| variant | s/step | vs off | model GFLOP/img | projector GFLOP/img | encoder GFLOP/img (params) |")
    print("|:--|--:|--:|--:|--:|--:|")
    for label, trainer in trainers.items():
        med = statistics.median(times[label])
        proj = enc = "-"
        if label != "off":
            targets = trainer.alignment.targets
            n_proj = sum(p.numel() for p in trainer.model.repa_projector.parameters())
            tokens = (model.input_size // model.patch_size) ** 2
            proj = f"{6 * n_proj * tokens / 1e9:.2f}"
            enc = f"{encoder_flops(targets.encoder, targets.size) / 1e9:.2f} ({encoder_param_count(targets.encoder) / 1e6:.0f}M)"
        name = "REPA off" if label == "off" else f"REPA, {label} at {trainer.alignment.targets.size} px"
        print(f"| {name} | {med:.3f} | {med / base:.2f}x | {model_flops / 1e9:.2f} | {proj} | {enc} |")
    with torch.device("meta"):  # shapes only: the recipe's sizes, counted without building their weights
        from dit_trainer.config import build_config
        from dit_trainer.models import get_spec

        xl = get_spec("SiT-XL/2").build_model_fn(build_config({"model": {"name": "SiT-XL/2"}}))
    xl_flops, enc_b = train_flops_per_image(xl), encoder_flops("dinov2_vitb14", 224)
    proj_xl = 6 * (1152 * 2048 + 2048 * 2048 + 2048 * 768) * 256
    print(f"# counted, REPA's recipe (SiT-XL/2, 256 px): model {xl_flops / 1e9:.1f} GFLOP/img (fwd+bwd), projector "
          f"{proj_xl / 1e9:.1f}, DINOv2-B/14 at 224 px {enc_b / 1e9:.1f} (fwd): "
          f"+{(proj_xl + enc_b) / xl_flops:.1%} of the model's FLOPs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
