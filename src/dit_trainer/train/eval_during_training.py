"""FID during training: the EMA model's samples against the training set's own statistics, every `eval.every` steps.

The reference statistics are fitted once, by rank 0 before step 1, and cached in
`OUTPUT_DIR/eval/` (a resumed run reads them back): the digit network over all real digits when
the data is the demo's digits, else the FID Inception over `eval.ref_images` random training
images (latents decoded by their VAE, or the images of an image folder), or the file `eval.ref`
names. A measurement draws `eval.num_samples` samples with balanced labels from the EMA weights
with the run's objective, as the sample grid does; chunk c always has the same labels and seed, so
successive FIDs differ by the model only. A text-conditioned model samples its held-out captions
instead, against those captions' own images (`eval_prompts`). Chunks are split over the ranks when every rank can
hold the EMA model (not under pipeline parallelism, where rank 0 draws them all); the features
are gathered on rank 0, which logs FID, sFID and Inception Score.

Rank 0 fits the reference while the others wait in a collective, which times out after the
process group's timeout (10 minutes by default with NCCL): beyond what one device measures in
that time, write the reference beforehand with `dit eval --ref-from-latents` and set `eval.ref`.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from dit_trainer.errors import DitError
from dit_trainer.parallel.utils import from_main
from dit_trainer.train.eval_prompts import PromptSet


def _holds_images(path) -> bool:
    """Whether `path` or one of its class folders holds image files (and it is not a latent folder)."""
    from dit_trainer.data.images import IMAGE_EXTENSIONS

    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "manifest.json")):
        return False
    for entry in os.scandir(path):
        names = [e.name for e in os.scandir(entry.path)] if entry.is_dir() else [entry.name]
        if any(n.lower().endswith(IMAGE_EXTENSIONS) for n in names):
            return True
    return False


class TrainingFID:
    """`due(step)`, then `measure(model, objective, step)` on every rank: FID, sFID and IS on rank 0."""

    def __init__(self, cfg, device, dims, amp_dtype=None, progress=False, condition=None, prompts=None):
        """Resolves the network (fetching the Inception weights on every rank) and fits or reads the reference.
        `prompts` (a `validation.HeldOut`): sample its rows through `condition` instead of class labels, and
        take the reference from its images (see `eval_prompts`)."""
        self.cfg, self.device, self.dims, self.amp_dtype, self.progress = cfg, device, dims, amp_dtype, progress
        ev = cfg.eval
        self.every = ev.every
        self.prompts = PromptSet.for_run(cfg, condition, prompts, device)
        auto = "digits" if cfg.data.path == "digits" else "inception"
        self.network_name = auto if ev.network == "auto" else ev.network
        # Every rank resolves the weights itself: offline, all of them stop here with the same line.
        self.weights = ev.inception_weights
        if self.network_name == "inception" and self.weights is None:
            from dit_trainer.evaluate.inception_weights import fetch_inception_weights

            self.weights = fetch_inception_weights(progress=progress and dims.is_main)
        self.every_rank_samples = not dims.pp_enabled
        self.network = None
        self._guide = None  # eval.guide's model, loaded at the first measurement that can have it
        self.reference = None
        failed = None
        if dims.is_main:
            try:
                self.reference = self._reference()
            except DitError as err:
                failed = f"{type(err).__name__}: {err}"
        # Decided on rank 0 and told to all, so every rank stops with the same line instead of waiting.
        failed = from_main(failed)
        if failed:
            raise DitError(f"eval.every {self.every}: cannot fit the reference statistics ({failed})")

    @classmethod
    def for_run(cls, trainer) -> "TrainingFID":
        """The trainer's: its device, layout and autocast, and a text-conditioned model's held-out captions."""
        return cls(trainer.cfg, trainer.device, trainer.dims, trainer.amp_dtype, trainer.cfg.logging.progress,
                   trainer.condition, trainer.validation.prompt_set)

    def due(self, step: int) -> bool:
        """Whether `step` is a measuring step."""
        return bool(self.every) and step % self.every == 0

    def _net(self):
        if self.network is None:
            from dit_trainer.evaluate.evaluator import load_network

            self.network = load_network(self.network_name, self.weights, self.device, progress=False)
        return self.network

    def _source(self) -> dict:
        """What the reference depends on; a cached reference is reused only when this matches."""
        cfg, ev = self.cfg, self.cfg.eval
        if ev.ref:
            return {"ref": os.path.abspath(ev.ref), "network": self.network_name}
        if self.prompts is not None:
            return {**self.prompts.source(), "network": self.network_name}
        if cfg.data.path == "digits":
            return {"data": "digits", "network": self.network_name}
        from dit_trainer.sample.decode import vae_source

        vae = vae_source(cfg)
        return {"data": os.path.abspath(cfg.data.path), "network": self.network_name, "ref_images": ev.ref_images,
                "vae": vae and vae[0], "image_size": cfg.data.image_size}

    def _reference(self):
        from dit_trainer.evaluate.evaluator import DIGITS_REF, reference, reference_from_images
        from dit_trainer.evaluate.latent_reference import reference_from_latents
        from dit_trainer.evaluate.stats import ReferenceStats

        cfg, ev = self.cfg, self.cfg.eval
        folder = Path(cfg.output_dir) / "eval"
        cached, record = folder / "reference.npz", folder / "reference.json"
        source = self._source()
        if cached.is_file() and record.is_file():
            try:
                if json.loads(record.read_text()) == source:
                    return ReferenceStats.load(cached)
            except ValueError:
                pass  # a damaged record: fit again
        t0 = time.perf_counter()
        net, device, prog = self._net(), self.device, self.progress
        if ev.ref:
            stats = reference(ev.ref, net, device=device, progress=prog)
        elif self.prompts is not None:
            stats = self.prompts.reference(net, self.network_name)
        elif cfg.data.path == "digits":
            stats = reference(DIGITS_REF, net, device=device, progress=prog)
        elif _holds_images(cfg.data.path):
            stats = reference_from_images(cfg.data.path, cached, net, image_size=cfg.data.image_size, device=device,
                                          progress=prog)
        else:
            vae = source["vae"]
            stats = reference_from_latents(cfg.data.path, None, vae, net, device=device, progress=prog,
                                           max_images=ev.ref_images or None, seed=cfg.train.seed,
                                           scaling_factor=cfg.data.scaling_factor)
        folder.mkdir(parents=True, exist_ok=True)
        stats.save(cached)
        record.write_text(json.dumps(source, indent=1) + "\n")
        print(f"eval: reference statistics ({self.network_name}) of {source.get('ref') or source.get('data')} fitted in "
              f"{time.perf_counter() - t0:.0f} s, cached in {cached}", flush=True)
        return stats

    def guide(self, model, step: int):
        """The autoguidance guide of `eval.guide` (loaded once, checked against `model`), None without one, or
        "missing" while the step of this run it names is not saved yet (at `step`, before that step's save);
        a one-line error when that step is past and its checkpoint is gone."""
        ev = self.cfg.eval
        if ev.guide is None:
            return None
        if self._guide is None:
            from dit_trainer.config.guide_spec import eval_guide_step
            from dit_trainer.errors import CheckpointError
            from dit_trainer.sample.run_settings import load_guide

            run = Path(self.cfg.output_dir)
            at = eval_guide_step(self.cfg)
            if at is not None:  # a checkpoint of this run: step `at`, saved after the measurement of that step
                path = run / "checkpoints" / f"step-{at:08d}"
                if not path.exists():
                    if step <= at:
                        return "missing"
                    raise CheckpointError(f"eval.guide {ev.guide}: {path} does not exist although step {at} is past (removed "
                                          f"by hand, or resumed from a run that did not keep it); keep it with "
                                          f"checkpoint.keep_steps, or name another guide")
            else:  # a folder, relative to output_dir
                path = run / Path(ev.guide).expanduser()
                if not path.exists():
                    raise CheckpointError(f"eval.guide {ev.guide}: {path} does not exist; pass an existing checkpoint "
                                          f"or run folder (relative to output_dir), or a step of this run")
            self._guide = load_guide(path, self.cfg, model, self.device, f"eval.guide {ev.guide}")[0]
        return self._guide

    def _features(self, model, objective, guide=None):
        """(Features, CLIP scores or None) of this rank's chunks of the measurement's samples ((None, None) for a
        rank with none)."""
        from dit_trainer.evaluate.features import Features, iter_features
        from dit_trainer.sample import load_decoder, sample_latents, to_images, to_uint8
        from dit_trainer.sample.fid_batch import chunk_labels, chunk_seed, rank_chunks

        ev, cfg = self.cfg.eval, self.cfg
        rank, world = (self.dims.rank, self.dims.world_size) if self.every_rank_samples else (0, 1)
        if self.prompts is not None:
            return self.prompts.features(self._net(), model, objective, rank_chunks(ev.num_samples, ev.sample_batch_size,
                                                                                    rank, world), self.amp_dtype)
        labels = chunk_labels(ev.num_samples, model.num_classes, cfg.train.seed)
        decoder = load_decoder(cfg, device=self.device)
        amp = torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

        def images():
            for c in rank_chunks(ev.num_samples, ev.sample_batch_size, rank, world):
                y = labels[c * ev.sample_batch_size:(c + 1) * ev.sample_batch_size]
                with amp:
                    latents = sample_latents(model, objective, y, cfg_scale=ev.cfg_scale, steps=ev.sample_steps,
                                             seed=chunk_seed(cfg.train.seed, c), device=self.device, guide=guide,
                                             guide_scale=ev.guide_scale or 1.0,
                                             guidance_interval=ev.guidance_interval)
                x = to_uint8(to_images(latents.float(), *decoder))
                yield np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x

        parts = list(iter_features(self._net(), images(), ev.sample_batch_size, device=self.device, progress=False))
        if not parts:
            return None, None
        return Features(*(np.concatenate([getattr(f, k) for f in parts]) for k in ("pool", "spatial", "logits"))), None

    def measure(self, model, objective, step: int):
        """FID, sFID and IS of `model`'s samples on rank 0 (None elsewhere); every rank calls it."""
        import torch.distributed as dist

        from dit_trainer.evaluate.features import Features
        from dit_trainer.evaluate.fid import frechet_distance
        from dit_trainer.evaluate.inception_score import inception_score
        from dit_trainer.evaluate.stats import gaussian_stats

        t0 = time.perf_counter()
        guide = self.guide(model, step) if model is not None else None
        missing = from_main(guide == "missing" if self.dims.is_main else None)
        if missing:
            if self.dims.is_main:
                print(f"step {step:7d}  FID skipped: eval.guide {self.cfg.eval.guide} is a later step of this run "
                      f"(it is measured once that checkpoint is saved)", flush=True)
            return None
        mine = self._features(model, objective, guide) if model is not None else None
        if dist.is_initialized():
            gathered = [None] * dist.get_world_size() if self.dims.is_main else None
            dist.gather_object(mine, gathered, dst=0)
        else:
            gathered = [mine]
        parts = [p for p in (gathered or []) if p is not None and p[0] is not None]
        if not self.dims.is_main:
            return None
        feats = Features(*(np.concatenate([getattr(p[0], k) for p in parts]) for k in ("pool", "spatial", "logits")))
        clip = [p[1] for p in parts if p[1] is not None]
        ref = self.reference
        values = {
            "fid": frechet_distance(*gaussian_stats(feats.pool), ref.mu, ref.sigma),
            "sfid": frechet_distance(*gaussian_stats(feats.spatial), ref.mu_s, ref.sigma_s),
            "inception_score": inception_score(feats.logits)[0],
            **({"clip_score": float(np.concatenate(clip).mean())} if clip else {}),
            "eval_seconds": time.perf_counter() - t0,
        }
        against = "the held-out captions' images" if self.prompts is not None else "the training set"
        clip_note = f"  CLIP score {values['clip_score']:.2f}" if clip else ""
        print(f"step {step:7d}  FID {values['fid']:.2f} ({self.network_name}, {len(feats)} samples against "
              f"{against}){clip_note}  sFID {values['sfid']:.2f}  IS {values['inception_score']:.2f}  "
              f"{values['eval_seconds']:.0f} s", flush=True)
        return values
