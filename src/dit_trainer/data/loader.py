"""Feeding a training loop: the dataset a config names, and a batch sampler that resumes mid-epoch.

Each optimizer step consumes one global batch: the indices `perm[b*G:(b+1)*G]` of epoch `e`,
where `perm` is a permutation seeded by (seed, e). A data-parallel rank takes its contiguous
share of that batch, so any layout sees the same global batch as one process does, and the
position (epoch, batch) is all that resuming needs.
"""

import torch
from torch.utils.data import DataLoader, Sampler

from dit_trainer.errors import ConfigError, DataError


def build_dataset(cfg):
    """The training dataset named by `cfg.data` (latents on disk, or "digits" for the demo)."""
    data = cfg.data
    if data.path is None:
        raise ConfigError("data.path is not set; pass --data.path LATENTS_DIR (or 'digits' for the demo data)")
    if data.path == "digits":
        from dit_trainer.data.digits import DigitsDataset

        return DigitsDataset(image_size=data.digits_size)
    from dit_trainer.data.latents import open_latent_dataset

    return open_latent_dataset(
        data.path,
        num_classes=cfg.model.num_classes,
        random_flip=data.random_flip,
        seed=cfg.train.seed,
        labels_file=data.labels_file,
    )


class GlobalBatchSampler(Sampler):
    """Yields, per step, this data-parallel rank's share of the global batch."""

    def __init__(self, dataset_len, global_batch_size, seed=0, dp_rank=0, dp_size=1, epoch=0, batch_in_epoch=0):
        if global_batch_size % dp_size:
            raise ConfigError(f"train.global_batch_size {global_batch_size} is not divisible by the {dp_size} data-parallel ranks")
        if dataset_len < global_batch_size:
            raise DataError(f"the dataset holds {dataset_len} samples, fewer than train.global_batch_size {global_batch_size}; lower the batch size")
        self.n = dataset_len
        self.global_batch_size = global_batch_size
        self.local = global_batch_size // dp_size
        self.seed, self.dp_rank = seed, dp_rank
        self.epoch, self.batch_in_epoch = epoch, batch_in_epoch

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.global_batch_size

    def __len__(self):
        return self.batches_per_epoch - self.batch_in_epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        perm = torch.randperm(self.n, generator=g)
        start = self.dp_rank * self.local
        for b in range(self.batch_in_epoch, self.batches_per_epoch):
            batch = perm[b * self.global_batch_size : (b + 1) * self.global_batch_size]
            yield batch[start : start + self.local].tolist()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}


class StepLoader:
    """An endless iterator of per-rank batches that knows its position for checkpoints."""

    def __init__(self, dataset, sampler: GlobalBatchSampler, num_workers=0, pin_memory=False):
        self.dataset, self.sampler = dataset, sampler
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self._it = None

    def _start_epoch(self):
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.sampler.epoch)
        # Non-persistent workers are forked per epoch, so they see the epoch set above.
        loader = DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )
        self._it = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._start_epoch()
        try:
            batch = next(self._it)
        except StopIteration:
            self.sampler.epoch += 1
            self.sampler.batch_in_epoch = 0
            self._start_epoch()
            batch = next(self._it)
        self.sampler.batch_in_epoch += 1
        return batch

    def state_dict(self) -> dict:
        """Position after the last batch handed out."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.epoch = int(state["epoch"])
        self.sampler.batch_in_epoch = int(state["batch_in_epoch"])
        self._it = None
