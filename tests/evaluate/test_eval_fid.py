import numpy as np
import pytest

pytest.importorskip("scipy")

from dit_trainer.errors import DataError, DitError  # noqa: E402
from dit_trainer.evaluate.features import Features  # noqa: E402
from dit_trainer.evaluate.fid import frechet_distance  # noqa: E402
from dit_trainer.evaluate.stats import GaussianAccumulator, ReferenceStats, gaussian_stats  # noqa: E402


def _spd(rng, d):
    a = rng.normal(size=(d, d))
    return a @ a.T / d + 0.1 * np.eye(d)


def _features_with(mu, sigma, n, rng):
    """n points whose sample mean and np.cov are exactly mu and sigma."""
    x = rng.normal(size=(n, len(mu)))
    x -= x.mean(0)
    x = x @ np.linalg.inv(np.linalg.cholesky(np.cov(x, rowvar=False))).T
    return x @ np.linalg.cholesky(sigma).T + mu


def _sqrt_psd(m):
    w, v = np.linalg.eigh(m)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def test_fid_of_a_set_against_itself_is_zero():
    rng = np.random.default_rng(0)
    f = rng.normal(size=(400, 32)) @ rng.normal(size=(32, 32))
    mu, sigma = gaussian_stats(f)
    assert abs(frechet_distance(mu, sigma, mu, sigma)) < 1e-6
    # A shifted copy is not zero: the test can fail.
    assert frechet_distance(mu + 1.0, sigma, mu, sigma) == pytest.approx(32.0, rel=1e-6)


def test_fid_matches_closed_form_for_known_gaussians():
    rng = np.random.default_rng(1)
    d = 12
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    s1, s2 = _spd(rng, d), _spd(rng, d)
    f1, f2 = _features_with(mu1, s1, 300, rng), _features_with(mu2, s2, 500, rng)
    # Through the package's path: features -> statistics -> .npz -> Fréchet distance.
    fit = ReferenceStats.from_features(Features(f1, f1[:, :4], f1[:, :3]))
    got = frechet_distance(*gaussian_stats(f2), fit.mu, fit.sigma)
    r1 = _sqrt_psd(s1)
    # The symmetric form Tr((S1^½ S2 S1^½)^½) equals Tr((S1 S2)^½) but is computed differently.
    expected = np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(_sqrt_psd(r1 @ s2 @ r1))
    assert got == pytest.approx(expected, rel=1e-8, abs=1e-8)
    assert got > 1.0


def test_fid_rejects_mismatched_sizes():
    with pytest.raises(DitError, match="feature sizes differ"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))


def test_reference_stats_roundtrip_and_adm_layout(tmp_path):
    rng = np.random.default_rng(2)
    pool, spatial = rng.normal(size=(50, 6)), rng.normal(size=(50, 5))
    ref = ReferenceStats.from_features(Features(pool, spatial, pool[:, :2]), network="digits")
    back = ReferenceStats.load(ref.save(tmp_path / "ref.npz"))
    for k in ("mu", "sigma", "mu_s", "sigma_s", "features"):
        np.testing.assert_allclose(getattr(back, k), getattr(ref, k), rtol=1e-6)
    assert back.network == "digits" and back.sigma.shape == (6, 6) and back.sigma_s.shape == (5, 5)
    # ADM's reference batches: the four arrays and images, nothing else.
    np.savez(tmp_path / "adm.npz", mu=ref.mu, sigma=ref.sigma, mu_s=ref.mu_s, sigma_s=ref.sigma_s,
             arr_0=np.zeros((2, 8, 8, 3), np.uint8))
    adm = ReferenceStats.load(tmp_path / "adm.npz")
    assert adm.network is None and adm.features is None and adm.mu.shape == (6,)
    np.savez(tmp_path / "images.npz", arr_0=np.zeros((2, 8, 8, 3), np.uint8))
    assert ReferenceStats.load(tmp_path / "images.npz") is None


def test_reference_stats_errors_are_one_line(tmp_path):
    np.savez(tmp_path / "half.npz", mu=np.zeros(3), sigma=np.eye(3))
    with pytest.raises(DataError, match="lacks mu_s, sigma_s") as err:
        ReferenceStats.load(tmp_path / "half.npz")
    assert "\n" not in str(err.value) and "half.npz" in str(err.value)
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(DataError, match="neither statistics"):
        ReferenceStats.load(tmp_path / "other.npz")
    with pytest.raises(DataError, match="not found"):
        ReferenceStats.load(tmp_path / "missing.npz")


def test_evaluate_uses_the_files_statistics_and_its_images_for_precision_recall(tmp_path, tiny_net, make_images):
    """ADM's reference batches: dataset statistics plus arr_0 images that only precision/recall use."""
    from dit_trainer.evaluate.evaluator import evaluate
    from dit_trainer.evaluate.features import extract_features

    net = tiny_net
    dataset, ref_images, samples = make_images(40, seed=1), make_images(30, seed=2), make_images(25, seed=3)
    fit = ReferenceStats.from_features(extract_features(net, dataset, progress=False))
    np.savez(tmp_path / "ref.npz", mu=fit.mu, sigma=fit.sigma, mu_s=fit.mu_s, sigma_s=fit.sigma_s,
             arr_0=ref_images, network=np.asarray("tiny"))
    np.savez(tmp_path / "samples.npz", arr_0=samples)
    m = evaluate(tmp_path / "samples.npz", tmp_path / "ref.npz", network=net, device="cpu", progress=False)
    s = extract_features(net, samples, progress=False)
    assert m["fid"] == pytest.approx(frechet_distance(*gaussian_stats(s.pool), fit.mu, fit.sigma), rel=1e-9)
    assert m["num_reference_features"] == 30 and m["num_samples"] == 25
    assert 0.0 <= m["precision"] <= 1.0 and 0.0 <= m["recall"] <= 1.0
    np.savez(tmp_path / "adm.npz", mu=fit.mu, sigma=fit.sigma, mu_s=fit.mu_s, sigma_s=fit.sigma_s)
    with pytest.raises(DitError, match="holds inception features"):  # no network key: ADM's Inception
        evaluate(tmp_path / "samples.npz", tmp_path / "adm.npz", network=net, device="cpu", progress=False)


def test_streamed_statistics_equal_the_whole_set():
    rng = np.random.default_rng(4)
    f = rng.normal(size=(301, 9)) * 0.3 + 1000.0  # a large mean: the naive one-pass formula would cancel
    acc = GaussianAccumulator()
    for start in range(0, len(f), 64):
        acc.update(f[start:start + 64].astype(np.float32))
    mu, sigma = acc.result()
    ref_mu, ref_sigma = gaussian_stats(f.astype(np.float32))
    np.testing.assert_allclose(mu, ref_mu, rtol=1e-12)
    np.testing.assert_allclose(sigma, ref_sigma, rtol=1e-7, atol=1e-9)
    with pytest.raises(ValueError, match="at least 2"):
        GaussianAccumulator().result()
