"""A PixArt run exported as a diffusers PixArtAlphaPipeline / PixArtSigmaPipeline folder: diffusers loads and
samples it with no code of ours and gives our images for the same prompt, seed and steps (its guidance is
the encoding of "", which our caption dropout trained: no learned null caption to lose); read back, it is
the same weights, text encoder and VAE, to sample or to fine-tune."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from dit_trainer.convert import Bundle, convert, read, write  # noqa: E402
from dit_trainer.errors import ConfigError  # noqa: E402

PROMPTS = ["a cat", "two dogs"]
TOL = 1e-4  # on images in [0, 1], uint8 / 255's scale
STEPS = 5  # divides DDIM's 1000 training steps, so both place the same timesteps

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, vae_dir):
    """(our run folder of a tiny random PixArt-alpha, its diffusers export)."""
    from tests.text_helpers import save_tiny_pixart_run, save_tiny_t5

    root = tmp_path_factory.mktemp("pixart_export")
    run = save_tiny_pixart_run(root / "run", vae_dir, save_tiny_t5(root / "t5"))
    out, _ = convert("ours", run, "diffusers", root / "pipe")
    return run, out


def _sampling(run, **settings):
    """The SamplingRun of `dit sample --ckpt RUN --sampler ddim` (its VAE loaded)."""
    from dit_trainer.sample.cli import load_vae, prepare_sampling
    from dit_trainer.sample.settings import resolve

    given = {"ckpt": str(run), "prompts": tuple(PROMPTS), "sampler": "ddim", "steps": STEPS, "seed": 3, **settings}
    sampling = prepare_sampling(resolve(given), str(run), torch.device("cpu"))
    load_vae(sampling)
    return sampling


@pytest.fixture(scope="module")
def ours(exported):
    return _sampling(exported[0])


def _images(sampling, cfg_scale=4.5, negative_prompt=None, seed=3):
    """Our images ([0, 1], N×H×W×C) as `dit sample` draws them: `sample_prompts` with the run's encoder."""
    from dit_trainer.sample.decode import to_images
    from dit_trainer.sample.prompts import sample_prompts

    latents = sample_prompts(sampling.model, sampling.objective, sampling.condition, sampling.encoder, PROMPTS,
                             negative_prompt=negative_prompt, cfg_scale=cfg_scale, sampler="ddim", steps=STEPS,
                             seed=seed)
    return ((to_images(latents, *sampling.decoder) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def _load(folder, cls="PixArtAlphaPipeline"):
    """diffusers' pipeline of the exported folder, loaded with no code of ours."""
    import diffusers
    from diffusers.utils import logging

    logging.set_verbosity_error()  # accelerate and bs4 notices
    pipe = getattr(diffusers, cls).from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def theirs(exported):
    return _load(exported[1])


def _call(pipe, cfg_scale=4.5, seed=3, **kw):
    return pipe(prompt=list(PROMPTS), num_inference_steps=STEPS, guidance_scale=cfg_scale, output_type="np",
                generator=torch.Generator().manual_seed(seed), use_resolution_binning=False, **kw).images


def test_folder_layout(exported):
    import json

    out = exported[1]
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "PixArtAlphaPipeline" and index["scheduler"] == ["diffusers", "DDIMScheduler"]
    assert index["text_encoder"] == ["transformers", "T5EncoderModel"]
    assert all((out / part).is_dir() for part in ("transformer", "text_encoder", "tokenizer", "vae", "scheduler"))


def test_diffusers_samples_our_images(ours, theirs):
    """Same prompts, seed and steps: diffusers' DDIM over the export gives what our DDIM gives, guided with
    the encoding of "" and with a negative prompt; the tolerance is far below what either changes."""
    mine, plain = _images(ours), _call(theirs)
    assert mine.shape == plain.shape == (2, 16, 16, 3)
    assert np.abs(mine - plain).max() < TOL
    negative = _images(ours, negative_prompt="blue")
    assert np.abs(negative - _call(theirs, negative_prompt="blue")).max() < TOL
    # What the comparison would catch: another unconditional caption, or no guidance, moves the images far more.
    assert np.abs(negative - plain).max() > 100 * TOL
    assert np.abs(_images(ours, cfg_scale=1.0) - plain).max() > 100 * TOL


def test_sigma_exports_to_its_pipeline(tmp_path, vae_dir):
    from dit_trainer.convert.pixart_pipeline import call_notes
    from tests.text_helpers import save_tiny_pixart_run, save_tiny_t5

    run = save_tiny_pixart_run(tmp_path / "run", vae_dir, save_tiny_t5(tmp_path / "t5"), seed=1,
                               name="PixArt-Sigma-XL/2-512", text_max_length=120)
    out, bundle = convert("ours", run, "diffusers", tmp_path / "pipe")
    assert "max_sequence_length=120" in call_notes(bundle)[0]  # the run's 120 tokens, not the pipeline's 300
    theirs = _call(_load(out, "PixArtSigmaPipeline"), max_sequence_length=120)
    assert np.abs(_images(_sampling(run)) - theirs).max() < TOL


def test_read_back_is_the_same_model(exported, ours, tmp_path):
    from safetensors.torch import load_file

    run, out = exported
    back, bundle = convert("diffusers", out, "ours", tmp_path / "back")
    want, got = load_file(f"{run}/ema.safetensors"), load_file(str(back / "ema.safetensors"))
    assert sorted(want) == sorted(got) and all(torch.equal(want[k], got[k]) for k in want)
    original = read("ours", run)
    assert {k: bundle.model[k] for k in original.model if k in bundle.model} == {
        k: v for k, v in original.model.items() if k in bundle.model}
    assert bundle.text_max_length == 120 and (back / "text_encoder").is_dir() and (back / "tokenizer").is_dir()
    assert np.array_equal(_images(_sampling(back), seed=4), _images(ours, seed=4))


class _Captions32(torch.utils.data.Dataset):
    """The text batch contract with the tiny T5's 32-wide embeddings: 8 random 4x8x8 latents and captions."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.embeds = torch.randn(8, 4, 8, 8, generator=g), torch.randn(8, 120, 32, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "text_embeds": self.embeds[i], "text_mask": torch.ones(120, dtype=torch.long)}

    def null_text(self):
        return {"text_embeds": torch.zeros(120, 32), "text_mask": torch.ones(120, dtype=torch.long)}


@pytest.mark.parametrize("part", ["", "transformer"])
def test_fine_tuning_starts_from_a_pipeline_folder(exported, tmp_path, part):
    """model.weights_path a pipeline (or its transformer/) folder: the model its config describes with its
    weights; a pipeline folder's VAE and text encoder become the data's."""
    from safetensors.torch import load_file

    from dit_trainer.train import DiTTrainer

    run, out = exported
    d = {"output_dir": str(tmp_path / "ft"), "model": {"weights_path": str(out / part)},
         "train": {"max_steps": 1, "global_batch_size": 4, "mixed_precision": "fp32", "device": "cpu"},
         "logging": {"log_steps": 1, "tensorboard": False, "progress": False}}
    trainer = DiTTrainer(d, dataset=_Captions32())
    cfg, want = trainer.cfg, load_file(f"{run}/ema.safetensors")
    assert cfg.model.name == "PixArt-alpha-XL/2-256" and cfg.model.options["text_hidden_size"] == 32
    assert all(torch.equal(trainer.model.state_dict()[k], want[k]) for k in want)
    if part == "":
        assert cfg.data.vae == str(out / "vae") and cfg.data.text_encoder == str(out.resolve())
    assert trainer.train_step(next(iter(torch.utils.data.DataLoader(_Captions32(), batch_size=4))))["loss"] > 0


def test_one_call_pipeline_takes_prompts(exported, theirs):
    from dit_trainer.convert.pipeline import DiTPipeline

    want = _call(theirs, negative_prompt="blue")
    for folder in exported:  # our run, and the exported diffusers folder
        pipe = DiTPipeline.from_pretrained(folder)
        mine = pipe(prompt=PROMPTS, negative_prompt="blue", num_inference_steps=STEPS, guidance_scale=4.5,
                    output_type="np", generator=torch.Generator().manual_seed(3))
        assert np.abs(mine - want).max() < TOL
    with pytest.raises(ConfigError, match=r"^this model is text-conditioned; pass prompt="):
        pipe(class_labels=[1])


def test_what_the_pipeline_cannot_compute_is_refused_in_one_line(exported, tmp_path):
    from tests.text_helpers import save_tiny_clip

    bundle = read("ours", exported[0])
    cases = [
        (Bundle(**{**vars(bundle), "text_encoder": save_tiny_clip(tmp_path / "clip")}), "encodes prompts with T5"),
        (Bundle(**{**vars(bundle), "text_encoder": None}), "records no text encoder"),
        (Bundle(**{**vars(bundle), "model": {**bundle.model, "name": "PixArt-alpha-XL/2-1024",
                                             "micro_conditions": True}}), "micro-conditions"),
        (Bundle(**{**vars(bundle), "latent_mean": [0.0] * 4, "latent_std": [1.0] * 4}), "normalised latents"),
        (Bundle(**{**vars(bundle), "transport": {"path_type": "Linear"}}), "objective transport"),
    ]
    for i, (case, words) in enumerate(cases):
        with pytest.raises(ConfigError) as err:
            write("diffusers", case, tmp_path / f"out{i}")
        assert words in str(err.value) and "\n" not in str(err.value)
        assert not (tmp_path / f"out{i}").exists()
