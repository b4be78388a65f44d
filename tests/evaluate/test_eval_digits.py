import json

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")
pytest.importorskip("scipy")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.evaluate.cli import add_commands  # noqa: E402
from dit_trainer.evaluate.digits_net import digit_split, load_digit_net, real_digits_uint8  # noqa: E402
from dit_trainer.evaluate.features import extract_features  # noqa: E402


def test_digit_network_recognises_held_out_real_digits():
    from dit_trainer.data.digits import load_digit_arrays

    net = load_digit_net()
    _, held = digit_split()
    labels = load_digit_arrays()[1][held]
    feats = extract_features(net, real_digits_uint8(held), progress=False)
    accuracy = float((feats.logits.argmax(1) == labels).mean())
    assert accuracy > 0.95, accuracy
    assert feats.pool.shape == (len(held), 64) and feats.spatial.shape == (len(held), 7 * 4 * 4)
    # Deterministic: the shipped weights, eval mode, same features twice.
    again = extract_features(load_digit_net(), real_digits_uint8(held[:20]), progress=False)
    np.testing.assert_array_equal(again.pool, feats.pool[:20])


def _run(argv, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="dit")
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def test_dit_eval_digits_real_beats_noise(tmp_path, capsys):
    rng = np.random.default_rng(0)
    real = real_digits_uint8(rng.permutation(1797)[:500])
    np.savez(tmp_path / "real.npz", arr_0=real)
    np.savez(tmp_path / "noise.npz", arr_0=rng.integers(0, 256, size=real.shape, dtype=np.uint8))
    code, out = _run(["eval", "--network", "digits", "--samples", str(tmp_path / "real.npz"), "--ref", "digits",
                      "--device", "cpu", "--no-progress", "--json", str(tmp_path / "real.json")], capsys)
    assert code == 0 and "FID:" in out and "Precision:" in out
    real_m = json.loads((tmp_path / "real.json").read_text())
    _run(["eval", "--network", "digits", "--samples", str(tmp_path / "noise.npz"), "--ref", "digits",
          "--device", "cpu", "--no-progress", "--json", str(tmp_path / "noise.json")], capsys)
    noise_m = json.loads((tmp_path / "noise.json").read_text())
    assert real_m["fid"] < 10 < 100 < noise_m["fid"]
    assert real_m["sfid"] < noise_m["sfid"]
    assert real_m["inception_score"] > 8 and noise_m["inception_score"] < 3
    assert real_m["precision"] > 0.8 and real_m["recall"] > 0.8 and noise_m["precision"] == 0.0
    assert real_m["num_samples"] == 500 and real_m["num_reference_features"] == 1797


def test_dit_eval_reference_from_an_image_folder(tmp_path, capsys):
    from PIL import Image

    images = real_digits_uint8(np.arange(60))
    for i, img in enumerate(images):
        Image.fromarray(img[..., 0]).save(tmp_path / f"{i:03d}.png")
    (tmp_path / "folder").mkdir()
    for p in tmp_path.glob("*.png"):
        p.rename(tmp_path / "folder" / p.name)
    ref = tmp_path / "ref.npz"
    code, out = _run(["eval", "--network", "digits", "--ref-from-images", str(tmp_path / "folder"),
                      "--out", str(ref), "--image-size", "16", "--device", "cpu", "--no-progress"], capsys)
    assert code == 0 and "60 pool features" in out
    with np.load(ref) as z:
        assert set(z.files) == {"mu", "sigma", "mu_s", "sigma_s", "features", "network"}
        assert z["mu"].shape == (64,) and z["sigma_s"].shape == (112, 112) and str(z["network"]) == "digits"
    # The same images as samples against their own folder's statistics: FID 0, precision/recall 1.
    np.savez(tmp_path / "same.npz", arr_0=images)
    _run(["eval", "--network", "digits", "--samples", str(tmp_path / "same.npz"), "--ref", str(ref),
          "--device", "cpu", "--no-progress", "--json", str(tmp_path / "m.json")], capsys)
    m = json.loads((tmp_path / "m.json").read_text())
    # 60 images for 64-d features: a singular covariance, so only round-off level, not 1e-6.
    assert abs(m["fid"]) < 1e-4 and m["precision"] == 1.0 and m["recall"] == 1.0
    # Statistics cover every image; only a random subset of features is kept for precision/recall.
    from dit_trainer.evaluate.evaluator import reference_from_images

    sub = reference_from_images(tmp_path / "folder", tmp_path / "sub.npz", "digits", image_size=16, device="cpu",
                                progress=False, pr_features=25, batch_size=7)
    full = np.load(ref)
    assert sub.features.shape == (25, 64)
    # Other batch sizes change float32 convolutions in the last bits only.
    np.testing.assert_allclose(sub.sigma, full["sigma"], rtol=1e-4, atol=1e-5)
    nearest = np.abs(sub.features[:, None] - full["features"][None]).max(-1).min(1)
    assert (nearest < 1e-4).all()  # each kept feature is one of the folder's


def test_dit_eval_errors_are_one_line(tmp_path, capsys):
    np.savez(tmp_path / "s.npz", arr_0=np.zeros((3, 16, 16, 3), np.uint8))
    assert main(["eval", "--samples", str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dit eval: error:") and "--ref" in err and "\n" not in err
    # Precision/recall with k = 3 need 4 samples; 10 equal IS splits need 10.
    assert main(["eval", "--network", "digits", "--samples", str(tmp_path / "s.npz"), "--ref", "digits",
                 "--device", "cpu", "--no-progress"]) == 2
    assert "holds 3 images" in capsys.readouterr().err
    np.savez(tmp_path / "s.npz", arr_0=np.zeros((8, 16, 16, 3), np.uint8))
    assert main(["eval", "--network", "digits", "--samples", str(tmp_path / "s.npz"), "--ref", "digits",
                 "--device", "cpu", "--no-progress", "--is-splits", "10"]) == 2
    assert "IS over 10 splits" in capsys.readouterr().err
    np.savez(tmp_path / "s.npz", arr_0=np.zeros((12, 16, 16, 3), np.uint8))
    # Inception without a weights file, offline (see tests/conftest.py): what to download, or --weights.
    assert main(["eval", "--samples", str(tmp_path / "s.npz"), "--ref", str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot download" in err and "--weights FILE" in err and "\n" not in err
    # Statistics measured by another network are refused before anything is computed.
    np.savez(tmp_path / "r.npz", mu=np.zeros(3), sigma=np.eye(3), mu_s=np.zeros(3), sigma_s=np.eye(3),
             network=np.asarray("inception"))
    assert main(["eval", "--network", "digits", "--samples", str(tmp_path / "s.npz"),
                 "--ref", str(tmp_path / "r.npz"), "--device", "cpu"]) == 2
    assert "holds inception features" in capsys.readouterr().err
    # --ref digits without --network digits: said first, not the Inception weight file it would then need.
    assert main(["eval", "--samples", str(tmp_path / "s.npz"), "--ref", "digits", "--device", "cpu"]) == 2
    assert "add --network digits" in capsys.readouterr().err


def test_singular_covariance_fid_prints_no_scipy_warning():
    import warnings

    from dit_trainer.evaluate.fid import frechet_distance

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((10, 64)), rng.standard_normal((10, 64))  # 10 samples, 64-d: singular
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's LinAlgWarning would fail here
        try:
            value = frechet_distance(a.mean(0), np.cov(a, rowvar=False), b.mean(0), np.cov(b, rowvar=False))
        except RuntimeWarning as warning:  # our own one-line note, when the product is not finite
            assert "singular covariance product" in str(warning)
        else:
            assert np.isfinite(value)


def test_bf16_digits_features_stay_close():
    images = real_digits_uint8(np.arange(64))
    net = load_digit_net()
    a = extract_features(net, images, progress=False)
    b = extract_features(net, images, dtype="bf16", progress=False)
    assert torch.allclose(torch.from_numpy(b.pool), torch.from_numpy(a.pool), rtol=0.05, atol=0.1)


def test_reference_from_images_skips_and_lists_unreadable_images(tmp_path, capsys):
    from PIL import Image

    from dit_trainer.errors import DataError
    from dit_trainer.evaluate.evaluator import reference_from_images, skipped_list_path

    for i, img in enumerate(real_digits_uint8(np.arange(20))):
        Image.fromarray(img[..., 0]).save(tmp_path / f"{i:03d}.png")
    kwargs = dict(network="digits", image_size=16, device="cpu", progress=False, batch_size=7)
    clean = reference_from_images(tmp_path, tmp_path / "clean.npz", **kwargs)
    # Broken files sorted among the good ones, so whole batches, partial batches and the features' order are tested.
    for name in ("005b.png", "013b.png"):
        (tmp_path / name).write_bytes(b"not a png")
    capsys.readouterr()
    ref = reference_from_images(tmp_path, tmp_path / "ref.npz", **kwargs)
    err = capsys.readouterr().err
    listing = skipped_list_path(tmp_path / "ref.npz")
    assert f"skipped 2 unreadable images, listed in {listing}" in err
    assert [line.split("\t")[0] for line in listing.read_text().splitlines()] == ["005b.png", "013b.png"]
    np.testing.assert_allclose(ref.sigma, clean.sigma, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref.features, clean.features, rtol=1e-4, atol=1e-5)  # other batches: last bits only
    with pytest.raises(DataError, match="005b.png: cannot read image"):
        reference_from_images(tmp_path, tmp_path / "stop.npz", on_bad_image="stop", **kwargs)
    for name in ("005b.png", "013b.png"):
        (tmp_path / name).unlink()
    reference_from_images(tmp_path, tmp_path / "ref.npz", **kwargs)
    assert not listing.exists()  # a stale list would name images that are gone


def test_an_image_batch_as_reference_is_measured_with_the_digit_network(tmp_path, capsys):
    # A plain arr_0 batch holds no statistics of any network: measured with the one asked for.
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "a.npz", arr_0=real_digits_uint8(rng.permutation(1797)[:300]))
    np.savez(tmp_path / "b.npz", arr_0=real_digits_uint8(rng.permutation(1797)[:300]))
    code, out = _run(["eval", "--network", "digits", "--samples", str(tmp_path / "a.npz"), "--ref",
                      str(tmp_path / "b.npz"), "--device", "cpu", "--no-progress", "--json", str(tmp_path / "m.json")],
                     capsys)
    m = json.loads((tmp_path / "m.json").read_text())
    # Two small real batches: FID carries small-sample bias (noise scores > 100), precision does not.
    assert code == 0 and m["num_reference_features"] == 300 and m["fid"] < 100 and m["precision"] > 0.8
