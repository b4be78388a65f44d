"""`dit train --config X.yaml [--section.field value ...]`.

Every config key is an option of its section's group, so `dit train --help` lists them all with
type, default and meaning (read from the config dataclasses: see `config.doc`). Values stay
strings here; `build_config` types and checks them after the YAML, in command-line order.
"""

import argparse

# Flags that users of the original DiT / fast-DiT / PaddleMIX scripts type, and the key each sets.
ALIASES = {
    "train.global_batch_size": ("--global-batch-size",),
    "output_dir": ("--results-dir",),
    "logging.sample_steps": ("--num-sampling-steps",),
    "checkpoint.save_steps": ("--ckpt-every",),
    "logging.log_steps": ("--log-every",),
    "optim.lr": ("--lr", "--learning_rate", "--learning-rate"),
    "data.path": ("--data-path",),
    "train.seed": ("--global-seed",),
    "data.num_workers": ("--num-workers",),
}


class _Override(argparse.Action):
    """Collects `--key value` in command-line order, so the last of a key and its alias wins."""

    def __call__(self, parser, namespace, values, option_string=None):
        pairs = getattr(namespace, "config_pairs", None) or []
        pairs.append((self.dest.replace("__", "."), values))
        namespace.config_pairs = pairs


def add_commands(sub) -> None:
    """Register `dit train` with one option per config key."""
    from dit_trainer.config.doc import config_docs, section_of, show

    p = sub.add_parser(
        "train",
        help="train a model from a YAML config",
        description="Train a model. Any config key can be set in the YAML file or overridden as "
                    "--section.field VALUE; model.input_size, model.in_channels and model.num_classes "
                    "come from the data unless set. Family options such as --model.depth are listed last.",
        usage="dit train [-h] [--config FILE] [--print-config] [--section.field VALUE ...]",
        allow_abbrev=False,
    )
    p.add_argument("--config", default=None, help="YAML or JSON config (see configs/), or a PaddleMIX DiT model JSON")
    p.add_argument("--print-config", action="store_true", help="print the merged config as YAML and exit")
    groups = {}
    for doc in config_docs():
        section = section_of(doc.key)
        if section not in groups:
            groups[section] = p.add_argument_group(f"{section or 'top-level'} keys")
        # dest keeps the key (dots as __): argparse's default dest would drop the section.
        groups[section].add_argument(
            f"--{doc.key}", *ALIASES.get(doc.key, ()), dest=doc.key.replace(".", "__"), action=_Override,
            metavar=doc.type.split()[0].upper(), default=argparse.SUPPRESS,
            help=f"{doc.help} [{doc.type}, default: {show(doc.default)}]".replace("%", "%%"),  # argparse formats help
        )
    p.set_defaults(func=run, accepts_overrides=True, config_pairs=[])
    _lazy_family_help(p)


def _lazy_family_help(parser) -> None:
    # The family options need the model registry (torch): list them only when help is printed.
    plain = parser.format_help

    def format_help():
        from dit_trainer.config.doc import family_docs, show

        lines = [plain().rstrip(), ""]
        for family, docs in family_docs():
            lines.append(f"model options of the {family} family:")
            for d in docs:
                option = f"--{d.key} {d.type.split()[0].upper()}"
                # As argparse lays out the keys above: an option too long for its column puts the help below it.
                sep = "\n" + " " * 24 if len(option) > 20 else " " * (22 - len(option))
                lines.append(f"  {option}{sep}{d.help} [{d.type}, default: {show(d.default)}]")
        return "\n".join(lines) + "\n"

    parser.format_help = format_help


def run(args) -> int:
    """Read the config, build the trainer of its backend (distributed when launched by torchrun) and train."""
    from dit_trainer.config import read_settings

    overrides = [item for key, value in args.config_pairs for item in (f"--{key}", value)]
    settings = read_settings(args.config, overrides + list(args.overrides))
    if args.print_config:
        from dit_trainer.config import build_config, config_yaml
        from dit_trainer.data.loader import DataShapes
        from dit_trainer.train.pretrained import PretrainedShapes

        # What the run would use: the weights' and the data's shape where the config sets none.
        cfg = build_config(settings, shapes=DataShapes(first=PretrainedShapes()))
        print(config_yaml(cfg), end="")
        return 0
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import build_trainer

    trainer = build_trainer(settings)
    if getattr(trainer, "device", None) is not None:  # the torch engine's; MindSpore's allocator is its own
        # A CPU step frees and allocates the same activations every step; the process-wide malloc
        # setting that keeps them for reuse is the command's to make (host_memory.py).
        keep_freed_memory_on(trainer.device)
    last = trainer.train()
    if trainer.is_main and last:
        print(f"step {trainer.step}: loss {last['loss']:.4f}; metrics in {trainer.cfg.output_dir}/metrics.jsonl")
    return 0
