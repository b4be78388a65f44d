"""Your own training loop from dit-trainer's public pieces, without DiTTrainer.

    python examples/train_minimal.py --data-path LATENTS --model DiT-S/2 --steps 1000 --out runs/minimal
    python examples/train_minimal.py --data-path digits --model DiT-S/4 --image-size 16 \
        --depth 4 --hidden-size 128 --num-heads 4 --steps 200

Model from the registry, Gaussian diffusion, a latent dataset, EMA and the checkpoint helpers:
the same parts the trainer uses, in the order the DiT paper describes one step. As in `dit train`,
the latents' side and channels and the class count come from the data unless given.
"""

import argparse
import copy
import time

import torch
from torch.utils.data import DataLoader

from dit_trainer.config import build_config, config_yaml
from dit_trainer.diffusion import create_diffusion
from dit_trainer.models import get_spec
from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.data.loader import DataShapes
from dit_trainer.parallel.ema import ShardedEMA


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-path", required=True, help="latents folder, shards, or 'digits'")
    p.add_argument("--model", default="DiT-S/2")
    p.add_argument("--image-size", type=int, default=None,
                   help="latent (or pixel) side; default: the data's (for digits: the side to upsample to, 16)")
    p.add_argument("--in-channels", type=int, default=None, help="default: the data's")
    p.add_argument("--num-classes", type=int, default=None, help="default: the data's")
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--hidden-size", type=int, default=None)
    p.add_argument("--num-heads", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--ema-decay", type=float, default=0.9999)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--ckpt-every", type=int, default=0, help="0: only at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--out", default="runs/minimal")
    return p.parse_args(argv)


def ema_model(model, ema):
    """A plain copy of `model` holding the EMA weights: what `dit sample` reads from ema.safetensors."""
    averaged = copy.deepcopy(model)
    averaged.load_state_dict(ema.state_dict())
    return averaged


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    # One config object describes the run, so the checkpoint can be sampled with `dit sample`.
    overrides = {
        "output_dir": args.out, "data.path": args.data_path, "model.name": args.model,
        "model.input_size": args.image_size, "model.in_channels": args.in_channels,
        "model.num_classes": args.num_classes, "model.depth": args.depth,
        "model.hidden_size": args.hidden_size, "model.num_heads": args.num_heads,
        "data.digits_size": args.image_size if args.data_path == "digits" else None,
        "train.seed": args.seed, "optim.lr": args.lr,
    }
    # Opened before the model, which takes the shape the data records wherever no flag set one.
    shapes = DataShapes()
    cfg = build_config({k: v for k, v in overrides.items() if v is not None}, shapes=shapes)
    dataset = shapes.dataset

    model = get_spec(cfg.model.name).build_model_fn(cfg).to(device)
    ema = ShardedEMA(model)  # the trainer's EMA; on one plain module it is DiT's update_ema
    diffusion = create_diffusion(timestep_respacing="", learn_sigma=cfg.model.learn_sigma)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0)

    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        num_workers=args.num_workers, generator=torch.Generator().manual_seed(args.seed))
    print(f"{cfg.model.name}: {sum(p.numel() for p in model.parameters()):,} parameters, {len(dataset):,} samples")

    step, epoch, running, t0 = 0, 0, 0.0, time.perf_counter()
    model.train()
    while step < args.steps:
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],), device=device)
            loss = diffusion.training_losses(model, x, t, model_kwargs=dict(y=y))["loss"].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            ema.update(args.ema_decay)
            step += 1
            running += loss.item()
            if step % args.log_every == 0:
                dt = time.perf_counter() - t0
                print(f"step {step:6d}  loss {running / args.log_every:.4f}  {args.log_every * args.batch_size / dt:.1f} img/s")
                running, t0 = 0.0, time.perf_counter()
            if (args.ckpt_every and step % args.ckpt_every == 0) or step == args.steps:
                path = save_checkpoint(cfg.output_dir, step, {
                    "model.safetensors": model.state_dict(),
                    "ema.safetensors": ema_model(model, ema).state_dict(),
                    "config.yaml": config_yaml(cfg),
                })
                print(f"saved {path}")
            if step >= args.steps:
                break
        epoch += 1
    return step


if __name__ == "__main__":
    main()
