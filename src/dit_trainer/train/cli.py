"""`dit train --config X.yaml [--section.field value ...]`."""


def add_commands(sub) -> None:
    """Register `dit train`."""
    p = sub.add_parser(
        "train",
        help="train a model from a YAML config",
        description="Train a model. Any config field can be overridden as --section.field VALUE.",
    )
    p.add_argument("--config", default=None, help="YAML config (see configs/)")
    p.set_defaults(func=run, accepts_overrides=True)


def run(args) -> int:
    """Load the config, build the trainer (distributed when launched by torchrun) and train."""
    from dit_trainer.config import load_config
    from dit_trainer.train import DiTTrainer

    cfg = load_config(args.config, args.overrides)
    trainer = DiTTrainer(cfg)
    last = trainer.train()
    if trainer.dims.is_main and last:
        print(f"step {trainer.step}: loss {last['loss']:.4f}; metrics in {cfg.output_dir}/metrics.jsonl")
    return 0
