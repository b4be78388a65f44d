import numpy as np
import pytest
from dit_trainer.errors import ConfigError, DataError
from dit_trainer.evaluate.features import extract_features
from dit_trainer.evaluate.npz import NpzImages


def test_feature_shapes_and_batching_invariance(tiny_net, make_images):
    net, images = tiny_net, make_images()
    whole = extract_features(net, images, batch_size=64, progress=False)
    assert whole.pool.shape == (23, 8) and whole.spatial.shape == (23, 2 * 5 * 5) and whole.logits.shape == (23, 5)
    assert whole.pool.dtype == np.float32 and len(whole) == 23
    pieces = extract_features(net, images, batch_size=4, progress=False)
    streamed = extract_features(net, (images[i:i + 7] for i in range(0, 23, 7)), progress=False, total=23)
    for other in (pieces, streamed):
        for key in ("pool", "spatial", "logits"):
            np.testing.assert_allclose(getattr(other, key), getattr(whole, key), rtol=1e-5, atol=1e-6)
    # Images are not interchangeable: the features depend on the pixels.
    assert not np.allclose(whole.pool[0], whole.pool[1])


def test_bf16_is_close_to_fp32(tiny_net, make_images):
    net, images = tiny_net, make_images(8)
    fp32 = extract_features(net, images, progress=False)
    bf16 = extract_features(net, images, dtype="bf16", progress=False)
    assert bf16.pool.dtype == np.float32
    np.testing.assert_allclose(bf16.pool, fp32.pool, rtol=0.05, atol=0.02)
    with pytest.raises(ConfigError, match="dtype must be one of fp32, bf16"):
        extract_features(net, images, dtype="fp16", progress=False)


def test_bad_batches_are_one_line_errors(tiny_net, make_images):
    net = tiny_net
    with pytest.raises(ConfigError, match="uint8 N×H×W×3"):
        extract_features(net, make_images().astype(np.float32), progress=False)
    with pytest.raises(ConfigError, match="positive integer"):
        extract_features(net, make_images(), batch_size=0, progress=False)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_images_stream_in_batches(tmp_path, compressed, make_images):
    batch = make_images(10, 6)
    (np.savez_compressed if compressed else np.savez)(tmp_path / "s.npz", arr_0=batch, arr_1=np.arange(10))
    reader = NpzImages(tmp_path / "s.npz")
    assert len(reader) == 10 and reader.shape == (10, 6, 6, 3)
    batches = list(reader.batches(4))
    assert [len(b) for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate(batches), batch)


def test_npz_grayscale_is_repeated_and_bad_files_are_refused(tmp_path, make_images):
    gray = make_images(3, 5)[..., :1]
    np.savez(tmp_path / "g.npz", arr_0=gray)
    (batch,) = NpzImages(tmp_path / "g.npz").batches(8)
    assert batch.shape == (3, 5, 5, 3) and (batch == gray).all()
    np.savez(tmp_path / "f.npz", arr_0=gray.astype(np.float32))
    with pytest.raises(DataError, match="expected uint8"):
        NpzImages(tmp_path / "f.npz")
    np.savez(tmp_path / "x.npz", images=gray)
    with pytest.raises(DataError, match="no 'arr_0'"):
        NpzImages(tmp_path / "x.npz")
    (tmp_path / "t.npz").write_text("not a zip")
    with pytest.raises(DataError, match="not an .npz"):
        NpzImages(tmp_path / "t.npz")
