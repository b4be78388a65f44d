"""The FID Inception weights fetched on first use into torch's hub cache, sha256-checked; served here from a local
file (never the release URL)."""

import hashlib

import pytest
import torch

from dit_trainer.cli import main
from dit_trainer.errors import CheckpointError, DitError
from dit_trainer.evaluate import inception_weights as iw


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(file:// URL of a small file, its sha256); TORCH_HOME is this test's own folder."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    src = tmp_path / "release" / "weights-x-0123abcd.pth"
    src.parent.mkdir()
    src.write_bytes(bytes(range(256)) * 40)
    return src, hashlib.sha256(src.read_bytes()).hexdigest()


def test_first_use_downloads_into_the_hub_cache_and_later_uses_read_it(served):
    src, digest = served
    path = iw.fetch_inception_weights(src.as_uri(), digest, progress=False)
    assert path == iw.hub_checkpoint_path(src.name) and path.parent == iw.hub_checkpoint_path().parent
    assert str(path).startswith(torch.hub.get_dir()) and path.read_bytes() == src.read_bytes()
    src.unlink()  # the release is gone: the cache answers
    assert iw.fetch_inception_weights(src.as_uri(), digest, progress=False) == path


def test_the_digest_may_be_a_prefix_as_torch_hub_names_files(served, monkeypatch):
    src, digest = served
    monkeypatch.setattr(iw, "INCEPTION_WEIGHTS_URL", src.as_uri())
    monkeypatch.setattr(iw, "INCEPTION_WEIGHTS_SHA256", digest[:8].upper())
    assert iw.fetch_inception_weights(progress=False).read_bytes() == src.read_bytes()


def test_a_wrong_digest_keeps_nothing_and_says_so_in_one_line(served):
    src, digest = served
    wrong = ("0" if digest[0] != "0" else "1") + digest[1:]
    with pytest.raises(CheckpointError) as err:
        iw.fetch_inception_weights(src.as_uri(), wrong, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and digest in msg and wrong in msg and "--weights" in msg
    folder = iw.hub_checkpoint_path(src.name).parent
    assert not folder.exists() or list(folder.iterdir()) == []  # no partial or wrong file left behind


def test_offline_is_one_line_naming_the_url_the_cache_and_weights(served):
    src, digest = served
    missing = src.with_name("gone.pth").as_uri()
    with pytest.raises(DitError) as err:
        iw.fetch_inception_weights(missing, digest, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and missing in msg and "--weights FILE" in msg
    assert str(iw.hub_checkpoint_path().parent) in msg


def test_load_inception_without_weights_fetches_the_release_file(tmp_path, monkeypatch):
    from dit_trainer.evaluate.inception import FIDInceptionV3, load_inception

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    state = {k: v for k, v in FIDInceptionV3().state_dict().items() if not k.endswith("num_batches_tracked")}
    release = tmp_path / iw.INCEPTION_WEIGHTS_FILE
    torch.save(state, release)
    monkeypatch.setattr(iw, "INCEPTION_WEIGHTS_URL", release.as_uri())
    monkeypatch.setattr(iw, "INCEPTION_WEIGHTS_SHA256", hashlib.sha256(release.read_bytes()).hexdigest())
    net = load_inception(None, progress=False)
    assert torch.equal(net.fc.weight, state["fc.weight"])
    assert iw.hub_checkpoint_path().is_file()


def test_dit_eval_offline_without_weights_is_one_line(tmp_path, capsys):
    import numpy as np

    np.savez(tmp_path / "s.npz", arr_0=np.zeros((12, 16, 16, 3), np.uint8))
    # The autouse fixture points the URL at a missing file: the machine is "offline".
    assert main(["eval", "--samples", str(tmp_path / "s.npz"), "--ref", str(tmp_path / "s.npz"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dit eval: error:") and "\n" not in err
    assert "cannot download" in err and "--weights FILE" in err and iw.INCEPTION_WEIGHTS_URL in err
