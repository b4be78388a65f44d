"""Damaged `.npy` headers and lengths where training reads latents and `dit data verify` checks them:
one line naming the file, never a traceback."""

import numpy as np
import pytest
from tests.data.test_latents import latent, make_fastdit, make_folder
from tests.data.test_shards import make_shards
from tests.test_npy import malformed

from dit_trainer.cli import main
from dit_trainer.data import FastDiTFeatures, NpyLatentFolder
from dit_trainer.errors import DataError

CASES = malformed(latent(0)[None])
LABEL_CASES = malformed(np.arange(3, dtype=np.int64))


def _one_line_error(fn, name):
    with pytest.raises(DataError) as info:
        fn()
    msg = str(info.value)
    assert name in msg and "\n" not in msg, msg
    return msg


def _verify_lines(capsys, path, *flags):
    code = main(["data", "verify", str(path), "--no-progress", *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert code == 1 and lines and all(line.startswith("dit data verify: ") for line in lines), err
    return lines


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_latent_is_one_line_naming_it(case, tmp_path, capsys):
    make_folder(tmp_path, n=3)
    (tmp_path / "img1.npy").write_bytes(CASES[case])
    _one_line_error(lambda: NpyLatentFolder(tmp_path, unconditional=True), "img1.npy")
    lines = _verify_lines(capsys, tmp_path, "--unconditional")
    assert any("img1.npy" in line for line in lines)


@pytest.mark.parametrize("case", ["unknown-descr", "negative-dimension", "cut-before-brace", "data-long", "size-huge"])
def test_a_latent_damaged_after_the_scan_is_one_line_when_read(case, tmp_path):
    make_folder(tmp_path, n=3)
    ds = NpyLatentFolder(tmp_path, unconditional=True)
    (tmp_path / "img2.npy").write_bytes(CASES[case])
    ds[0]
    _one_line_error(lambda: ds[2], "img2.npy")


@pytest.mark.parametrize("case", sorted(LABEL_CASES))
def test_damaged_label_files_are_one_line(case, tmp_path):
    make_fastdit(tmp_path / "fast", [1, 0, 1])
    (tmp_path / "fast" / "imagenet256_labels" / "1.npy").write_bytes(LABEL_CASES[case])
    _one_line_error(lambda: FastDiTFeatures(tmp_path / "fast"), "1.npy")
    make_folder(tmp_path / "plain", n=3)
    (tmp_path / "plain" / "labels.npy").write_bytes(LABEL_CASES[case])
    _one_line_error(lambda: NpyLatentFolder(tmp_path / "plain"), "labels.npy")


@pytest.mark.parametrize("case", ["unknown-descr", "negative-dimension", "non-integer-dimension", "cut-before-brace",
                                  "data-short", "data-long", "size-overflows"])
def test_dit_data_verify_reports_a_damaged_shard_in_one_line(case, tmp_path, capsys):
    data, labels = make_shards(tmp_path, counts=(5, 3))
    (tmp_path / "shard-00001.npy").write_bytes(malformed(data[5:])[case])
    (tmp_path / "shard-00000.labels.npy").write_bytes(malformed(labels[:5])[case])
    lines = _verify_lines(capsys, tmp_path)
    assert any("shard-00001.npy: cannot open" in line for line in lines), lines
    assert any("shard-00000.labels.npy: cannot read" in line for line in lines), lines
