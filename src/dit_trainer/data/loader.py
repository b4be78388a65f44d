"""Feeding a training loop: the dataset a config names, and a batch sampler that resumes mid-epoch.

Each optimizer step consumes one global batch: the indices `perm[b*G:(b+1)*G]` of epoch `e`,
where `perm` is a permutation seeded by (seed, e). A data-parallel rank takes its contiguous
share of that batch, so any layout sees the same global batch as one process does, and the
position (epoch, sample in the epoch) is all that resuming needs.
"""

import os

import torch
from torch.utils.data import DataLoader, Sampler

from dit_trainer.errors import ConfigError, DataError


def caption_tokens(cfg):
    """The tokens a caption is encoded to: data.text_max_length, else the model family's release length
    (PixArt-alpha 120, PixArt-Sigma 300), else None (the encoder's own default)."""
    if cfg.data.text_max_length:
        return int(cfg.data.text_max_length)
    try:
        from dit_trainer.models.spec import get_spec

        return get_spec(cfg.model.name).text_max_length or None
    except ConfigError:
        return None  # an unknown model name is reported where the model is built


def build_dataset(cfg, num_classes=None):
    """The training dataset named by `cfg.data` (latents on disk, or "digits" for the demo);
    `num_classes` checks the data against a class count the user set (None: the data says)."""
    data = cfg.data
    if data.path is None:
        raise ConfigError("data.path is not set; pass --data.path LATENTS_DIR (or 'digits' for the demo data)")
    if data.path == "digits" and data.text_encoder is not None:
        # The text-conditioned demo's data: each digit captioned with what its pixels show.
        from dit_trainer.data.digits_text import CaptionedDigits
        from dit_trainer.text_encoders import load_text_encoder

        encoder = load_text_encoder(data.text_encoder, data.text_dtype, "cpu", caption_tokens(cfg))
        return CaptionedDigits(encoder, image_size=data.digits_size, seed=cfg.train.seed)
    if data.path == "digits":
        from dit_trainer.data.digits import DigitsDataset

        return DigitsDataset(image_size=data.digits_size)
    from dit_trainer.data.online import looks_like_image_folder

    # Captioned images (any layout, local or URL) with a text encoder; shards record their own encoder.
    captioned = data.text_encoder is not None and not os.path.isfile(os.path.join(data.path, "manifest.json"))
    if captioned or looks_like_image_folder(data.path):
        from dit_trainer.data.online import open_image_folder

        text = {"encoder": data.text_encoder, "max_length": caption_tokens(cfg) or 0, "dtype": data.text_dtype,
                "empty": data.empty_captions} if captioned else None
        dataset = open_image_folder(data.path, vae=data.vae, image_size=data.image_size, vae_dtype=data.vae_dtype,
                                    device=cfg.train.device, cache_dir=data.cache_dir, random_flip=data.random_flip,
                                    seed=cfg.train.seed, text=text)
        dataset.allow_changed = bool(data.allow_changed)  # read by StepLoader when a checkpoint is resumed
        return dataset
    from dit_trainer.data.latents import open_latent_dataset

    return open_latent_dataset(
        data.path,
        num_classes=num_classes,
        random_flip=data.random_flip,
        seed=cfg.train.seed,
        labels_file=data.labels_file,
        unconditional=data.unconditional,
    )


def _source(cfg, dataset) -> str:
    path = cfg.data.path
    if getattr(dataset, "source", None):
        return dataset.source
    if path is None:
        return f"the {type(dataset).__name__} given to the trainer"
    if getattr(dataset, "manifest", None) is not None:
        return os.path.join(path, "manifest.json")
    return f"data.path {path}"


class DataShapes:
    """`build_config(source, shapes=DataShapes(...))`: opens the dataset the config names (unless given one) and takes the
    model's shape from it where the user left it out; `.dataset` keeps what it opened for the loader.

    `model.in_channels`, `model.input_size`, `model.num_classes` and `data.class_names` come from
    what the data records (the shard manifest, the labels file, the latents' shape), and for shards
    the VAE and image size too; a value the user set that the data contradicts is a one-line error.
    `first` is a fill that runs before (the weights of `model.weights_path`) and returns the keys it
    set: the data must agree with those, and its labels need only fit inside the model's classes.
    """

    def __init__(self, dataset=None, first=None):
        self.dataset, self.first = dataset, first

    def __call__(self, cfg, given: frozenset) -> None:
        weights = frozenset(self.first(cfg, given) or ()) if self.first is not None else frozenset()
        if self.dataset is None:
            if cfg.data.path is None:
                return
            count = cfg.model.num_classes if "model.num_classes" in given and not weights else None
            self.dataset = build_dataset(cfg, num_classes=count)
        dataset, source = self.dataset, _source(cfg, self.dataset)

        def take(key: str, value, what: str) -> None:
            have = _get(cfg, key)
            if key in weights and have != value:
                raise ConfigError(f"model.weights_path {cfg.model.weights_path} is for {key} {have} but {source} holds "
                                  f"{what}; train these weights on data of their shape, or start from other weights")
            if key not in given and key not in weights:
                _set(cfg, key, value)
            elif have != value:
                raise ConfigError(f"{key} is {have} but {source} holds {what}; set {key} to {value} or leave it out "
                                  f"(the data decides it)")

        shape = getattr(dataset, "latent_shape", None)
        if shape is not None:
            channels, height, width = shape
            if height != width:
                raise DataError(f"{source}: the latents are {height}x{width}; the model needs square latents, "
                                "re-extract them square")
            take("model.in_channels", int(channels), f"{channels}-channel latents")
            take("model.input_size", int(height), f"{height}x{width} latents")
        if getattr(dataset, "text_hidden_size", None) is not None:
            _take_text(cfg, given, dataset, take)
        count = getattr(dataset, "num_classes", None)
        if count is not None and cfg.model.weights_path:
            _labels_fit(cfg, dataset, source, int(count), "model.num_classes" in weights)
        elif count is not None:
            take("model.num_classes", int(count), f"{count} classes")
        names = getattr(dataset, "class_names", None)
        if names and "data.class_names" not in given and len(names) == cfg.model.num_classes:
            cfg.data.class_names = [str(n) for n in names]
        if cfg.data.class_names is not None and len(cfg.data.class_names) != cfg.model.num_classes:
            raise ConfigError(f"data.class_names lists {len(cfg.data.class_names)} names but model.num_classes is "
                              f"{cfg.model.num_classes}; make them agree")
        manifest = getattr(dataset, "manifest", None) or {}
        for key, field in (("data.vae", "vae"), ("data.image_size", "image_size"),
                           ("data.scaling_factor", "scaling_factor")):
            if manifest.get(field) is not None and key not in given:
                setattr(cfg.data, key.split(".")[1], manifest[field])
        from dit_trainer.data.latent_norm import fill_latent_stats

        fill_latent_stats(cfg, given, dataset, source)


def _get(cfg, key: str):
    """The value of dotted `key`; a model key that is no shared field is the family's option."""
    section, name = key.split(".")
    obj = getattr(cfg, section)
    return obj.options.get(name) if section == "model" and not hasattr(obj, name) else getattr(obj, name)


def _set(cfg, key: str, value) -> None:
    section, name = key.split(".")
    obj = getattr(cfg, section)
    if section == "model" and not hasattr(obj, name):
        obj.options[name] = value
    else:
        setattr(obj, name, value)


# What a text family takes from text data, when its config dataclass declares the field.
TEXT_FIELDS = (("text_hidden_size", "{}-wide text embeddings"), ("text_pooled_size", "pooled text vectors of {}"),
               ("text_max_length", "captions of {} tokens"))


def _take_text(cfg, given, dataset, take) -> None:
    """Text data: its encoder and token count go to `data.*`, and the sizes its family declares (the
    options named in TEXT_FIELDS) to the model."""
    if "data.text_encoder" not in given:
        cfg.data.text_encoder = dataset.text_encoder
    take("data.text_max_length", int(dataset.text_max_length), f"captions of {dataset.text_max_length} tokens")
    try:
        from dit_trainer.models.spec import get_spec

        config_cls = get_spec(cfg.model.name).config_cls
    except ConfigError:
        return  # an unknown model name is reported where the model is built
    import dataclasses

    declared = {f.name for f in dataclasses.fields(config_cls)} if config_cls is not None else set()
    for option, what in TEXT_FIELDS:
        value = getattr(dataset, option, None)
        if option in declared and value is not None:
            take(f"model.{option}", int(value), what.format(value))


def _labels_fit(cfg, dataset, source: str, count: int, from_weights: bool) -> None:
    """A model started from weights keeps its class count; the data's labels must fit inside it."""
    labels = getattr(dataset, "labels", None)
    largest = int(labels.max()) if labels is not None and len(labels) else count - 1
    have = cfg.model.num_classes
    if largest >= have:
        where = f" (from model.weights_path {cfg.model.weights_path})" if from_weights else ""
        raise ConfigError(f"{source} has label {largest} but the model has {have} classes{where}; set "
                          f"model.num_classes to {largest + 1} or more (the label embedding then starts anew)")


class GlobalBatchSampler(Sampler):
    """Yields, per step, this data-parallel rank's share of the global batch.

    The position is kept in samples (`sample_in_epoch`), so a resume with another global batch
    size continues at the sample the run stopped at instead of reusing a batch index.
    """

    def __init__(self, dataset_len, global_batch_size, seed=0, dp_rank=0, dp_size=1, epoch=0, batch_in_epoch=0,
                 kept=None):
        """`kept`: the indices training reads (a held-out split leaves the rest out); None: all of them."""
        self.kept = None if kept is None else torch.as_tensor(kept, dtype=torch.long)
        self.held_out = 0 if kept is None else dataset_len - len(self.kept)
        dataset_len = dataset_len if kept is None else len(self.kept)
        if global_batch_size % dp_size:
            raise ConfigError(f"train.global_batch_size {global_batch_size} is not divisible by the {dp_size} data-parallel ranks")
        if dataset_len < global_batch_size:
            raise DataError(f"the dataset holds {dataset_len} samples, fewer than train.global_batch_size {global_batch_size}; lower the batch size")
        self.n = dataset_len
        self.global_batch_size = global_batch_size
        self.local = global_batch_size // dp_size
        self.seed, self.dp_rank = seed, dp_rank
        self.epoch, self.sample_in_epoch = epoch, batch_in_epoch * global_batch_size

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.global_batch_size

    @property
    def batch_in_epoch(self) -> int:
        """Global batches handed out in this epoch (counted in this run's batch size)."""
        return self.sample_in_epoch // self.global_batch_size

    def __len__(self):
        return max(0, (self.n - self.sample_in_epoch) // self.global_batch_size)

    def __iter__(self):
        # Seeds up to 2**63 stay within the 64 bits torch's generator takes.
        g = torch.Generator().manual_seed((self.seed * 100003 + self.epoch) % 2**64)
        perm = torch.randperm(self.n, generator=g)
        start = self.dp_rank * self.local
        for first in range(self.sample_in_epoch, self.n - self.global_batch_size + 1, self.global_batch_size):
            batch = perm[first : first + self.global_batch_size]
            if self.kept is not None:
                batch = self.kept[batch]
            yield batch[start : start + self.local].tolist()

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "sample_in_epoch": self.sample_in_epoch,
                 "global_batch_size": self.global_batch_size}
        if self.held_out:  # only then: a run without a split saves what it always saved
            state["held_out"] = self.held_out
        return state


class StepLoader:
    """An endless iterator of per-rank batches that knows its position for checkpoints.

    `stage` (an image folder's `CacheEncoder`) sits between the workers and the trainer:
    `stage.start_epoch(e)` gives (dataset, collate_fn, finish) for each epoch, `finish(batch)` runs
    in this process, and `flush()` passes on to `stage.flush()`.
    """

    def __init__(self, dataset, sampler: GlobalBatchSampler, num_workers=0, pin_memory=False, stage=None):
        self.dataset, self.sampler = dataset, sampler
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.stage = stage
        self._it = None
        self._finish = None
        self._refusal = None  # why the resumed data is not the checkpoint's, raised before the first batch

    def _start_epoch(self):
        dataset, collate, self._finish = self.dataset, None, None
        if self.stage is not None:
            dataset, collate, self._finish = self.stage.start_epoch(self.sampler.epoch)
        elif hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.sampler.epoch)
        # Non-persistent workers are forked per epoch, so they see the epoch set above.
        loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            collate_fn=collate,
        )
        self._it = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        if self._refusal is not None:
            raise DataError(self._refusal)
        if self._it is None:
            self._start_epoch()
        try:
            batch = next(self._it)
        except StopIteration:
            self.sampler.epoch += 1
            self.sampler.sample_in_epoch = 0
            self._start_epoch()
            batch = next(self._it)
        self.sampler.sample_in_epoch += self.sampler.global_batch_size
        return self._finish(batch) if self._finish is not None else batch

    def flush(self) -> None:
        """Write what the stage keeps in memory (an image folder's freshly encoded latents)."""
        if self.stage is not None:
            self.stage.flush()

    def stop_workers(self) -> None:
        """End the epoch's worker processes now; the next batch forks new ones at the same sample (as after a
        resume). Left to the garbage collector, a loader in a reference cycle (a finished trainer's) can lose
        its queues' feeder threads before the iterator's shutdown sends the workers their stop, which then
        waits 5 s per worker and kills them."""
        if self._it is not None and getattr(self._it, "_workers", None):
            self._it._shutdown_workers()
            self._it = None

    def state_dict(self) -> dict:
        """Position after the last batch handed out, and the data's fingerprint where it has one."""
        state = self.sampler.state_dict()
        if getattr(self.dataset, "fingerprint", None) is not None:
            state["fingerprint"] = self.dataset.fingerprint
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue at the saved sample: positions of checkpoints written before they were kept in
        samples count batches of `global_batch_size` (the saved run's, when the state says)."""
        self.sampler.epoch = int(state["epoch"])
        if "sample_in_epoch" in state:
            self.sampler.sample_in_epoch = int(state["sample_in_epoch"])
        else:
            saved = state.get("global_batch_size") or self.sampler.global_batch_size
            self.sampler.sample_in_epoch = int(state["batch_in_epoch"]) * int(saved)
        self._it = None
        self._check_fingerprint(state.get("fingerprint"))
        saved = int(state.get("held_out", 0))
        if saved != self.sampler.held_out and self._refusal is None:
            self._refusal = (f"the checkpoint's run held out {saved} samples of the data for validation and this one "
                             f"{self.sampler.held_out}, so its data order would differ; set data.val_split {saved}")

    def _check_fingerprint(self, saved) -> None:
        """A changed image folder makes the resume inexact: refused before the first batch (raised
        from `__next__`, not here, where a resume would take it for a damaged checkpoint), or one
        warning with data.allow_changed."""
        from dit_trainer.data.fingerprint import changes

        what = changes(saved, getattr(self.dataset, "fingerprint", None))
        if what is None:
            return
        if getattr(self.dataset, "allow_changed", False):
            import sys

            print(f"warning: {what}; continuing on the changed data (data.allow_changed), so the resume is not "
                  "exact", file=sys.stderr, flush=True)
        else:
            self._refusal = (f"{what}, so resuming would not continue the same run; restore the folder, or pass "
                             "--data.allow_changed true to continue on the changed data")
