"""An optional Weights & Biases sink (`logging.wandb: true`); `WANDB_MODE=offline` needs no network."""

import uuid
from pathlib import Path

from dit_trainer.errors import ConfigError


class WandbSink:
    """Scalars and sample grids to a W&B run that a resumed training continues."""

    def __init__(self, output_dir, project: str, config: dict):
        try:
            import wandb
        except ImportError:
            raise ConfigError("logging.wandb needs the wandb package: pip install 'dit-trainer[wandb]', "
                              "or set logging.wandb false") from None
        self._wandb = wandb
        # The run id lives in the output folder, so a resume appends to the same W&B run.
        id_file = Path(output_dir) / "wandb_id.txt"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(project=project, dir=str(output_dir), config=config, id=run_id,
                              name=Path(output_dir).name, resume="allow")

    def log(self, step: int, values: dict) -> None:
        """Scalars of `step`."""
        self.run.log({f"train/{k}": v for k, v in values.items() if isinstance(v, (int, float))}, step=step)

    def log_image(self, step: int, tag: str, path) -> None:
        """A PNG written by the trainer."""
        self.run.log({tag: self._wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()
