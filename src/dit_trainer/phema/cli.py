"""`dit ema RUN --std 0.05 0.08 [--at STEP] [--out DIR]`: post-hoc EMA weights from a run's snapshots."""


def add_commands(sub) -> None:
    """Register `dit ema`."""
    p = sub.add_parser(
        "ema", help="rebuild EMA weights of any width from a run's post-hoc EMA snapshots (train.phema_stds)",
        description="Rebuild the EMA of each --std (sigma_rel, EDM2's relative width) at a snapshot step from the "
                    "power-function profiles a run stored (train.phema_stds), and write each as a checkpoint folder "
                    "that dit sample, sample-ddp, eval and convert read.")
    p.add_argument("run_dir", metavar="RUN", help="the run's output_dir (holding phema/snapshot-*.safetensors)")
    p.add_argument("--std", type=float, nargs="+", required=True, metavar="SIGMA_REL",
                   help="widths to rebuild, each in (0, 0.2887), e.g. 0.05 0.08 0.10")
    p.add_argument("--at", type=int, default=None, metavar="STEP",
                   help="the snapshot step to rebuild at (default: the newest snapshot)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write the folders here instead of RUN/phema (named stdS-stepXXXXXXXX either way)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Rebuild and print each folder with how closely its profile was matched."""
    import json

    from dit_trainer.errors import ConfigError
    from dit_trainer.fs import check_output_path
    from dit_trainer.phema.posthoc import reconstruct

    if args.out is not None:  # before minutes of reading snapshots
        check_output_path(args.out, "--out", ConfigError, folder=True)

    for folder in reconstruct(args.run_dir, args.std, at_step=args.at, out=args.out):
        record = json.loads((folder / "phema.json").read_text())
        print(f"{folder}  (sigma_rel {record['std']} at step {record['step']} from "
              f"{len({s['file'] for s in record['snapshots']})} snapshots; profile fit error {record['fit_error']:.2%})")
    return 0

