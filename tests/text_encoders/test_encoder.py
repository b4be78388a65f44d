"""Frozen text encoders loaded back from save_pretrained folders: T5, CLIP with projection, Gemma 2."""

import pytest
import torch

from tests.text_helpers import save_tiny_clip, save_tiny_gemma2, save_tiny_t5

pytest.importorskip("transformers")

from dit_trainer.errors import DataError  # noqa: E402
from dit_trainer.text_encoders import load_text_encoder  # noqa: E402

CAPTIONS = ["a cat", "two thin dogs on a red mat with a small photo of the one blue digit"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_encoders")
    return {"t5": save_tiny_t5(root / "t5"), "clip": save_tiny_clip(root / "clip"),
            "gemma2": save_tiny_gemma2(root / "gemma2")}


def test_t5_is_frozen_in_eval_where_its_fresh_module_is_not(folders):
    from transformers import T5EncoderModel

    encoder = load_text_encoder(folders["t5"], max_length=40)
    assert encoder.kind == "t5" and encoder.hidden_size == 32 and encoder.pooled_size is None
    assert not encoder.model.training and not any(p.requires_grad for p in encoder.model.parameters())
    encoder.model.train()  # what a parent module's train() would do: the encoder stays in eval
    assert not encoder.model.training
    out = encoder.encode(CAPTIONS)
    assert out["text_embeds"].shape == (2, 40, 32) and out["text_mask"].dtype == torch.int64
    # ByT5 reads bytes: a byte a token and </s>, padding after, the long caption cut at 40 and counted.
    assert out["text_mask"].sum(1).tolist() == [len(CAPTIONS[0]) + 1, 40] and encoder.truncated == 1
    # The trap: a module built by __init__ trains (dropout 0.1), and its outputs then change call to call.
    fresh = T5EncoderModel.from_pretrained(folders["t5"])
    fresh.train()
    ids, mask = encoder.tokenize(CAPTIONS)
    with torch.no_grad():
        noisy = fresh(input_ids=ids, attention_mask=mask).last_hidden_state
        exact = fresh.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.equal(noisy, exact) and torch.equal(out["text_embeds"], exact)
    assert torch.equal(encoder.encode(CAPTIONS)["text_embeds"], out["text_embeds"])


def test_clip_gives_last_hidden_state_and_pooled_projection(folders):
    from transformers import CLIPTextModelWithProjection

    encoder = load_text_encoder(folders["clip"])
    assert encoder.kind == "clip" and encoder.max_length == 16 and encoder.pooled_size == 24
    out = encoder.encode(CAPTIONS)
    reference = CLIPTextModelWithProjection.from_pretrained(folders["clip"]).eval()
    with torch.no_grad():
        want = reference(input_ids=encoder.tokenize(CAPTIONS)[0])
    assert torch.equal(out["text_embeds"], want.last_hidden_state) and torch.equal(out["text_pooled"], want.text_embeds)
    assert out["text_pooled"].shape == (2, 24) and out["text_mask"].shape == (2, 16)
    assert encoder.truncated == 1  # the long caption ran past CLIP's 16 positions
    with pytest.raises(DataError, match="more than the 16 positions"):
        load_text_encoder(folders["clip"], max_length=17)


def test_gemma2_gives_its_decoders_hidden_states_in_bf16(folders):
    from transformers import Gemma2ForCausalLM

    encoder = load_text_encoder(folders["gemma2"], dtype="bf16", max_length=12)
    assert encoder.kind == "gemma2" and encoder.dtype == torch.bfloat16 and encoder.identity()["dtype"] == "bfloat16"
    out = encoder.encode(CAPTIONS)
    lm = Gemma2ForCausalLM.from_pretrained(folders["gemma2"], dtype=torch.bfloat16).eval()
    ids, mask = encoder.tokenize(CAPTIONS)
    with torch.no_grad():
        want = lm.model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert out["text_embeds"].dtype == torch.bfloat16 and torch.equal(out["text_embeds"], want)
    assert out["text_mask"][0].tolist() == [1, 1] + [0] * 10  # right padding, as Sana sets it


def test_a_padded_batch_encodes_each_caption_alike_whatever_else_is_in_it(folders):
    encoder = load_text_encoder(folders["t5"], max_length=24)
    first = encoder.encode(["a cat", "one"], pad_to=8)["text_embeds"][0]
    assert torch.equal(first, encoder.encode(["a cat", "two dogs", "the red mat"], pad_to=8)["text_embeds"][0])
    assert encoder.encode(["a cat"], pad_to=8)["text_embeds"].shape == (1, 24, 32)


def test_a_folder_missing_weights_is_one_line_not_random_numbers(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_tiny_t5(tmp_path / "t5")
    weights = load_file(f"{folder}/model.safetensors")
    dropped = "encoder.final_layer_norm.weight"
    save_file({k: v for k, v in weights.items() if k != dropped}, f"{folder}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(DataError, match=f"lacks 1 weight.*{dropped}.*save_pretrained") as err:
        load_text_encoder(folder)
    assert "\n" not in str(err.value)
