"""`dit plot RUN_DIR`: the loss curve of any run, from its `metrics.jsonl`, as `loss.png`."""

from pathlib import Path

from dit_trainer.errors import DitError


def plot_loss(metrics_path, out_path, title="training loss") -> Path:
    """Loss against step from `metrics.jsonl`, as a PNG."""
    from dit_trainer.train.metrics import read_metrics

    records = [r for r in read_metrics(metrics_path) if "loss" in r]
    if not records:
        raise DitError(f"{metrics_path} holds no loss records yet; train for at least logging.log_steps steps")
    steps = [r["step"] for r in records]
    losses = [r["loss"] for r in records]
    try:
        import matplotlib
    except ImportError:
        raise DitError("drawing the loss needs matplotlib: pip install matplotlib (or dit-trainer[demo])") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, losses, color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)
    return Path(out_path)


def add_commands(sub) -> None:
    """Register `dit plot`."""
    p = sub.add_parser("plot", help="draw a run's loss curve (RUN_DIR/loss.png)",
                       description="Draw the training loss of a run from RUN_DIR/metrics.jsonl.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run's output_dir (holding metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG to write (default: RUN_DIR/loss.png)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Draw the curve and say where it is."""
    metrics = Path(args.run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        raise DitError(f"{metrics} does not exist; pass a run's output_dir (it holds metrics.jsonl)")
    path = plot_loss(metrics, args.out or Path(args.run_dir) / "loss.png", title=f"{Path(args.run_dir).name}: training loss")
    print(path)
    return 0
