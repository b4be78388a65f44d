"""GeneratorDataset over our latent formats; weight conversion both ways; the torch-free import."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import TINY, rel, torch, torch_dit

from dit_trainer_mindspore.convert import convert, main
from dit_trainer_mindspore.data import build_dataset, epoch_order, open_source


def test_generator_dataset_reads_npy_folder_in_epoch_order(tmp_path):
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((10, 4, 4, 4)).astype(np.float32)
    for i, x in enumerate(xs):
        np.save(tmp_path / f"{i:02d}.npy", x[None])  # 1×C×H×W is accepted too
    labels = rng.integers(0, 5, 10)
    np.save(tmp_path / "labels.npy", labels)
    src = open_source(str(tmp_path))
    batches = list(build_dataset(src, 4, seed=7, epoch=1, skip_batches=1).create_tuple_iterator(output_numpy=True))
    order = epoch_order(10, 7, 1)[4:8]
    assert len(batches) == 1  # 10 items, batch 4, one batch skipped, the remainder dropped
    np.testing.assert_array_equal(batches[0][0], xs[order])
    np.testing.assert_array_equal(batches[0][1], labels[order])


def test_shards_are_read_with_numpy(tmp_path):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((5, 1, 1, 4, 4, 4)).astype(np.float16)  # N×F×K×C×H×W, stored sample
    np.save(tmp_path / "shard-00000.npy", data)
    np.save(tmp_path / "shard-00000.labels.npy", np.arange(5))
    manifest = {"format": "dit-trainer-latent-shards", "version": 1, "count": 5, "latent_shape": [4, 4, 4],
                "dtype": "float16", "num_classes": 5, "class_names": None, "vae": "x", "scaling_factor": 1.0,
                "image_size": 32, "flips": False, "posterior": "sample", "shards": [{"name": "shard-00000", "count": 5}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    src = open_source(str(tmp_path), random_flip=False)
    x, y = src[3]
    np.testing.assert_array_equal(x, data[3, 0, 0].astype(np.float32))
    assert int(y) == 3
    flipped = open_source(str(tmp_path), random_flip=True)
    got = [flipped[i][0] for i in range(5)]
    assert any(np.array_equal(g, data[i, 0, 0, ..., ::-1].astype(np.float32)) for i, g in enumerate(got))


def test_convert_ours_and_dit_pt_to_mindspore_and_back(tmp_path):
    from safetensors.torch import save_file

    import mindspore as ms
    from dit_trainer_mindspore.model import DiT

    tm = torch_dit(TINY)
    sd = {k: v.contiguous() for k, v in tm.state_dict().items()}
    save_file(sd, str(tmp_path / "ema.safetensors"))  # our checkpoint dir layout
    torch.save({"model": sd, "ema": {"module." + k: v for k, v in sd.items()}}, tmp_path / "release.pt")
    assert convert(str(tmp_path), str(tmp_path / "a.ckpt"), "ours", "mindspore") == len(sd)
    assert convert(str(tmp_path / "release.pt"), str(tmp_path / "b.ckpt"), "dit-pt", "mindspore") == len(sd)
    back = tmp_path / "back.safetensors"
    assert main(["--from", "mindspore", "--to", "ours", str(tmp_path / "a.ckpt"), str(back)]) == 0
    from safetensors.numpy import load_file

    for k, v in load_file(str(back)).items():
        np.testing.assert_array_equal(v, sd[k].numpy())
    convert(str(tmp_path / "b.ckpt"), str(tmp_path / "back.pt"), "mindspore", "dit-pt")
    assert set(torch.load(tmp_path / "back.pt", weights_only=True)) == set(sd)
    # The converted .ckpt loads through model.weights_path and computes what PyTorch computes.
    from dit_trainer_mindspore.checkpoint import load_weights

    mm = DiT(**TINY)
    load_weights(mm, str(tmp_path / "b.ckpt"))
    direct = DiT(**TINY)
    load_weights(direct, str(tmp_path / "release.pt"))  # model.weights_path converts a .pt on the fly
    for (n, p), (_, q) in zip(mm.parameters_and_names(), direct.parameters_and_names()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())
    x = np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)
    tm.eval()
    with torch.no_grad():
        ref = tm(torch.from_numpy(x), torch.tensor([3, 700]), torch.tensor([1, 2]), force_drop_ids=torch.tensor([0, 0]))
    out = mm(ms.Tensor(x), ms.Tensor(np.array([3, 700], np.int32)), ms.Tensor(np.array([1, 2], np.int32)),
             ms.Tensor(np.zeros(2, np.int32)))
    assert rel(out.asnumpy(), ref.numpy()) < 1e-4


def test_convert_wrong_size_is_one_line_error(tmp_path, capsys):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in torch_dit(TINY).state_dict().items()}, str(tmp_path / "w.safetensors"))
    assert main(["--from", "ours", "--to", "mindspore", "--model", "DiT-S/2", str(tmp_path / "w.safetensors"),
                 str(tmp_path / "w.ckpt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--model" in err and "\n" not in err
    assert not os.path.exists(tmp_path / "w.ckpt")


BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked")
sys.meta_path.insert(0, Block())
import numpy as np
from dit_trainer_mindspore.engine import MindSporeTrainer
eng = MindSporeTrainer({"model_name": "DiT-S/2", "input_size": 4, "num_classes": 4, "mixed_precision": "fp32",
                       "model": {"depth": 1, "hidden_size": 32, "num_heads": 2}})
out = eng.train_step((np.zeros((2, 4, 4, 4), np.float32), np.array([0, 1])))
assert isinstance(out["loss"], float), out
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print("ok", out["loss"])
"""


def test_backend_runs_without_torch():
    res = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=300,
                         env={**os.environ})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("ok")
