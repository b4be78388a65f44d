import pytest
import torch
import torch.nn.functional as F

from dit_trainer.errors import CheckpointError, DitError
from dit_trainer.evaluate.inception import INCEPTION_WEIGHTS_URL, FIDInceptionV3, load_inception
from dit_trainer.evaluate.resize import resize_bilinear_tf1


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return FIDInceptionV3().eval()


def test_inception_builds_and_gives_adm_sized_outputs(net):
    with torch.no_grad():
        out = net(torch.rand(1, 3, 299, 299) * 255)
        small = net(torch.rand(1, 3, 32, 32) * 255)  # resized to 299 inside
    assert out["pool"].shape == (1, 2048)
    assert out["spatial"].shape == (1, 7 * 17 * 17)
    assert out["logits"].shape == (1, 1008)
    assert {k: tuple(v.shape[1:]) for k, v in small.items()} == {k: tuple(v.shape[1:]) for k, v in out.items()}
    assert torch.isfinite(out["pool"]).all() and (out["pool"] >= 0).all()  # pool_3 averages ReLUs
    # torch-fidelity's weight-file names, which pytorch-fid's file shares.
    keys = net.state_dict().keys()
    assert "Mixed_6d.branch1x1.conv.weight" in keys and "Mixed_7c.branch3x3dbl_3b.bn.running_var" in keys
    assert sum(p.numel() for p in net.parameters()) == 23_850_960


def test_weights_roundtrip_and_wrong_keys_are_one_line(tmp_path, net):
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "w.pth")
    loaded = load_inception(tmp_path / "w.pth")
    assert torch.equal(loaded.fc.weight, net.fc.weight) and not loaded.training
    bad = dict(state)
    bad["extra.weight"] = bad.pop("Mixed_5b.branch1x1.conv.weight")
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError) as err:
        load_inception(tmp_path / "bad.pth")
    msg = str(err.value)
    assert "\n" not in msg and "bad.pth" in msg and "Mixed_5b.branch1x1.conv.weight" in msg and "extra.weight" in msg
    state["fc.weight"] = state["fc.weight"][:1000]
    torch.save(state, tmp_path / "shape.pth")
    with pytest.raises(CheckpointError, match=r"fc.weight has shape \(1000, 2048\)"):
        load_inception(tmp_path / "shape.pth")


def test_missing_weights_name_the_file_and_where_it_is_published(tmp_path):
    with pytest.raises(DitError) as err:
        load_inception(tmp_path / "nope.pth")
    assert "nope.pth" in str(err.value) and INCEPTION_WEIGHTS_URL in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DitError, match="--weights"):
        load_inception(None, progress=False)  # offline here (see tests/conftest.py)
    (tmp_path / "junk.pth").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="cannot read weights"):
        load_inception(tmp_path / "junk.pth")


def test_tf1_resize_has_no_half_pixel_offset():
    x = torch.tensor([[[[0.0, 10.0]]]]).expand(1, 1, 2, 2).contiguous()
    # Output pixel i reads input i * 2/4: 0, 0.5, 1, 1.5 (clamped to the last pixel).
    assert resize_bilinear_tf1(x, 4)[0, 0, 0].tolist() == [0.0, 5.0, 10.0, 10.0]
    y = torch.rand(2, 3, 9, 9)
    assert torch.equal(resize_bilinear_tf1(y, 9), y)
    # Not torch's half-pixel bilinear, which would give 0, 2.5, 7.5, 10.
    assert not torch.allclose(resize_bilinear_tf1(x, 4), F.interpolate(x, size=4, mode="bilinear"))
