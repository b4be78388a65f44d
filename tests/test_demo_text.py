"""`dit demo --text`: one short run writes the grid, the samples with their prompts, the loss curve, the prompt
following scores and a text encoder folder that transformers reads as it reads a released T5."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.data.digit_attributes import HELD_OUT, caption, is_held_out
from dit_trainer.demo_text import demo_text_config, grid_rows

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 40


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One short `dit demo --text` run: (its folder, what it printed)."""
    import contextlib
    import io

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("demo_text")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["demo", "--text", "--steps", "6", "--out", str(out), "--per-class", "1", "--no-progress",
                     "--fid-samples", str(SAMPLES)]) == 0
    return out, printed.getvalue()


def test_shipped_yaml_is_the_text_demo_config():
    shipped = build_config(ROOT / "configs" / "demo_digits_text.yaml")
    assert shipped == build_config(demo_text_config(shipped.output_dir))


def test_outputs_and_scores(run):
    out, printed = run
    with np.load(out / "samples.npz") as data:  # allow_pickle stays off: the prompts are a plain string array
        images, digits, prompts, held = data["arr_0"], data["arr_1"], data["prompts"], data["held_out"]
        weights, slants = data["weights"], data["slants"]
    assert images.shape == (SAMPLES, 8, 8, 3) and images.dtype == np.uint8 and images.std() > 0
    assert [caption(d, w, s) for d, w, s in zip(digits, weights, slants)] == prompts.tolist()
    assert held.tolist() == is_held_out(digits, weights, slants).tolist()
    report = json.loads((out / "prompt_following.json").read_text())
    table = report["prompt_following"]
    assert table["seen"]["n"] + table["held_out"]["n"] == SAMPLES
    for row in table.values():
        assert all(row[k] is None or 0 <= row[k] <= 1 for k in ("digit", "weight", "slant", "all"))
    assert report["fid"] > 0 and report["held_out"] == [caption(*t) for t in HELD_OUT]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "fid" in r] == [6] and "held_out_all" in logged[-1]
    # 20 prompts (each digit's held-out combination and a seen one) of one sample each, labelled on the left.
    grid = Image.open(out / "samples.png")
    assert grid.height == 6 * (20 * 10 + 2) and grid.width > 6 * 12 and grid.mode == "L"
    assert len(grid_rows()) == 20 and sum(r in HELD_OUT for r in grid_rows()) == 10
    assert Image.open(out / "loss.png").size[0] > 100
    assert "trained 6 steps" in printed and "held-out" in printed and "FID against the real digits" in printed


def test_text_encoder_folder_loads_as_a_released_t5(run):
    from transformers import AutoTokenizer, T5EncoderModel

    from dit_trainer.text_encoders import load_text_encoder

    out, _ = run
    folder = out / "text_encoder"
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    cfg = build_config(out / "config.yaml")
    assert Path(cfg.data.text_encoder) == folder.resolve() and cfg.data.text_max_length == 8
    encoder = load_text_encoder(folder, "fp32", "cpu", 8)
    prompt = "a thin left-slanted four"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer([prompt], padding="max_length", max_length=8, return_tensors="pt")
    assert ids["attention_mask"][0].sum() == 5  # a word a token, and </s>
    model = T5EncoderModel.from_pretrained(folder, use_safetensors=True).eval()
    with torch.no_grad():
        theirs = model(**ids).last_hidden_state
    ours = encoder.encode([prompt])
    assert torch.equal(ours["text_mask"], ids["attention_mask"].long())
    assert torch.allclose(ours["text_embeds"], theirs, atol=1e-6)


def test_training_data_holds_no_held_out_combination(run):
    from dit_trainer.data.loader import build_dataset

    out, _ = run
    dataset = build_dataset(build_config(out / "config.yaml"))
    assert len(dataset) == 1797 - 196 and not is_held_out(dataset.digits, dataset.weights, dataset.slants).any()
    assert not {caption(*t) for t in HELD_OUT} & set(dataset.captions)
    for i in (0, 1, 2):  # a word a token, and </s>
        item = dataset[i]
        assert item["x"].shape == (1, 8, 8) and item["text_embeds"].shape == (8, 64)
        assert item["text_mask"].sum() == len(dataset.captions[i].split()) + 1


def test_text_demo_refuses_diffusion(tmp_path, capsys):
    assert main(["demo", "--text", "--objective", "diffusion", "--out", str(tmp_path / "unused")]) == 2
    assert "transport" in capsys.readouterr().err and not (tmp_path / "unused").exists()
