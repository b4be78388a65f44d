import json

import pytest

from dit_trainer.class_names import dataset_class_names, imagenet_class_names, resolve_labels
from dit_trainer.config import Config
from dit_trainer.errors import ConfigError


def test_imagenet_list():
    names = imagenet_class_names()
    assert len(names) == 1000
    assert names[0] == "tench, Tinca tinca"
    assert names[207] == "golden retriever"
    assert names[360] == "otter"
    assert names[999] == "toilet tissue, toilet paper, bathroom tissue"
    assert all(n == n.strip() and n for n in names)


def test_resolve_names_synonyms_case_and_ids():
    names = imagenet_class_names()
    got = resolve_labels(["golden retriever", "OTTER", "Tinca tinca", "toilet_paper", 5, "42", "tench, tinca tinca"], names)
    assert got == [207, 360, 0, 999, 5, 42, 0]


def test_shared_names_prefer_the_exact_entry_or_refuse():
    names = imagenet_class_names()
    assert resolve_labels(["maillot"], names) == [638]  # all of 638, only a synonym of 639
    with pytest.raises(ConfigError, match="ambiguous.*134.*517"):
        resolve_labels(["crane"], names)


def test_unknown_name_suggests_closest():
    with pytest.raises(ConfigError, match="unknown class name 'golden retreiver'.*'golden retriever'") as err:
        resolve_labels(["golden retreiver"], imagenet_class_names())
    assert "\n" not in str(err.value)


def test_unknown_name_among_few_classes_lists_them_all():
    with pytest.raises(ConfigError) as err:
        resolve_labels(["cat", "horse"], ["cat", "dog"])
    assert str(err.value) == "unknown class name 'horse'; this model's classes are 'cat' (0), 'dog' (1)"


def test_out_of_range_and_nameless():
    with pytest.raises(ConfigError, match="out of range"):
        resolve_labels([10], num_classes=10)
    with pytest.raises(ConfigError, match="no class names"):
        resolve_labels(["cat"], None)
    assert resolve_labels(["cat", 1], ["dog", "Cat"]) == [1, 1]


def test_dataset_class_names(tmp_path):
    cfg = Config()
    cfg.model.num_classes = 10
    cfg.data.path = "digits"
    assert dataset_class_names(cfg) == [str(i) for i in range(10)]

    cfg.data.path = str(tmp_path)
    (tmp_path / "labels.json").write_text(json.dumps({"labels": {}, "class_names": ["a", "b"]}))
    cfg.model.num_classes = 2
    assert dataset_class_names(cfg) == ["a", "b"]

    cfg.data.path = str(tmp_path / "elsewhere")  # training data not on this machine
    assert dataset_class_names(cfg) is None
    cfg.model.num_classes = 1000
    assert dataset_class_names(cfg)[207] == "golden retriever"


def test_manifest_class_names(tmp_path):
    shards = pytest.importorskip("dit_trainer.data.shards")
    shards.write_manifest(
        str(tmp_path), count=0, latent_shape=[4, 8, 8], dtype="float16", num_classes=3, class_names=["x", "y", "z"],
        vae="some/vae", scaling_factor=0.5, image_size=64, flips=False, posterior="sample", shards=[],
    )
    cfg = Config()
    cfg.model.num_classes, cfg.data.path = 3, str(tmp_path)
    assert dataset_class_names(cfg) == ["x", "y", "z"]
