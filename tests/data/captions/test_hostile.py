"""Captioned data from the internet: member names that leave the shard, links, captions that are not
UTF-8, hold NUL bytes or run to megabytes, manifest paths out of their folder: one line each, naming
the file and what to do, and nothing extracted."""

import io
import json
import os
import tarfile

import pytest

from tests.text_helpers import tar_bytes, webdataset_members, write_captioned_folder

from dit_trainer.data.captions import list_captioned  # noqa: E402
from dit_trainer.data.captions.text import MAX_CAPTION_BYTES  # noqa: E402
from dit_trainer.errors import DataError  # noqa: E402


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    return write_captioned_folder(tmp_path_factory.mktemp("hostile") / "images", count=2)


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/cron.d/job.txt", "a/../../escape.png", "C:/x.txt"])
def test_a_member_leaving_the_shard_is_refused_and_nothing_is_written(items, tmp_path, name):
    shard = tmp_path / "bad.tar"
    shard.write_bytes(tar_bytes(webdataset_members(items) + [(name, b"payload")]))
    with pytest.raises(DataError, match="would leave the shard's folder") as err:
        list_captioned(shard)
    assert f"{shard}: member {name!r}" in _one_line(err) and "delete it" in str(err.value)
    assert sorted(os.listdir(tmp_path)) == ["bad.tar"]
    assert not (tmp_path.parent / "escape.txt").exists() and not (tmp_path.parent / "escape.png").exists()


def test_link_members_are_refused(items, tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in webdataset_members(items):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("0002.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    (tmp_path / "link.tar").write_bytes(out.getvalue())
    with pytest.raises(DataError, match=r"member '0002.txt' is a link \(to '/etc/passwd'\)"):
        list_captioned(tmp_path / "link.tar")


BAD_CAPTIONS = [(b"caf\xe9 au lait", "is not UTF-8 text (byte 3)"),
                (b"a cat\x00\x01\x02", "holds a NUL byte (at byte 5)"),
                (b"a" * (3 * 1024 * 1024), f"is 3145728 bytes, over the {MAX_CAPTION_BYTES}")]


@pytest.mark.parametrize("raw,what", BAD_CAPTIONS, ids=["latin1", "nul", "megabytes"])
def test_a_bad_caption_in_a_folder_is_one_line_naming_its_file(items, tmp_path, raw, what):
    write_captioned_folder(tmp_path, count=2)
    (tmp_path / "0001.txt").write_bytes(raw)
    with pytest.raises(DataError) as err:
        list_captioned(tmp_path)
    assert _one_line(err).startswith(f"{tmp_path / '0001.txt'}: the caption {what}")


@pytest.mark.parametrize("raw,what", BAD_CAPTIONS, ids=["latin1", "nul", "megabytes"])
def test_a_bad_caption_in_a_shard_is_one_line_naming_its_member(items, tmp_path, raw, what):
    members = webdataset_members(items)
    members[-1] = ("0001.txt", raw)
    (tmp_path / "s.tar").write_bytes(tar_bytes(members))
    with pytest.raises(DataError) as err:
        list_captioned(tmp_path / "s.tar")
    assert _one_line(err).startswith(f"{tmp_path / 's.tar'}:0001.txt: the caption {what}")


def test_a_bad_manifest_line_is_one_line_naming_it(items, tmp_path):
    write_captioned_folder(tmp_path, count=2)
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(json.dumps({"path": "0000.png", "caption": "ok"}).encode() + b"\n" +
                         b'{"path": "0001.png", "caption": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"m\.jsonl line 2: the caption is not UTF-8 text"):
        list_captioned(manifest)
    manifest.write_text(json.dumps({"path": "0000.png", "caption": "a\u0000b"}) + "\n")
    with pytest.raises(DataError, match=r"m\.jsonl line 1: the caption holds a NUL character"):
        list_captioned(manifest)
    manifest.write_text(json.dumps({"path": "0000.png", "caption": "x" * (2 * MAX_CAPTION_BYTES)}) + "\n")
    with pytest.raises(DataError, match=r"m\.jsonl line 1 runs past"):
        list_captioned(manifest)


@pytest.mark.parametrize("path", ["../outside.png", "/etc/passwd", "sub/../../outside.png", "file:///etc/passwd"])
def test_a_manifest_path_out_of_its_folder_is_not_followed(tmp_path, path):
    (tmp_path / "m.jsonl").write_text(json.dumps({"path": path, "caption": "a cat"}) + "\n")
    with pytest.raises(DataError, match="leaves the manifest's folder") as err:
        list_captioned(tmp_path / "m.jsonl")
    assert f"{tmp_path / 'm.jsonl'} line 1: the image path {path!r}" in _one_line(err)


@pytest.mark.parametrize("escaped,what", [("cat\\u0000dog", "holds a NUL character"),
                                          ("cat\\ud800dog", "holds a lone surrogate (character 3)")],
                         ids=["nul", "surrogate"])
def test_json_escapes_are_held_to_the_caption_rules(items, tmp_path, escaped, what):
    write_captioned_folder(tmp_path, count=2)
    (tmp_path / "0001.txt").unlink()
    (tmp_path / "0001.json").write_text('{"caption": "%s"}' % escaped)
    with pytest.raises(DataError) as err:
        list_captioned(tmp_path)
    assert _one_line(err).startswith(f"{tmp_path / '0001.json'}: the caption {what}")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"path": "0000.png", "caption": "%s"}\n' % escaped)
    with pytest.raises(DataError, match=rf"m\.jsonl line 1: the caption {what[:12]}"):
        list_captioned(manifest)


def test_a_csv_row_the_csv_module_cannot_read_is_one_line(items, tmp_path):
    write_captioned_folder(tmp_path, count=2)
    manifest = tmp_path / "m.csv"
    long_line = "x" * 60_000
    manifest.write_text(f'path,caption\n0000.png,"{long_line}\n{long_line}\n{long_line}"\n')
    with pytest.raises(DataError, match=r"m\.csv line \d+ is not a CSV row \(field larger than field limit") as err:
        list_captioned(manifest)
    _one_line(err)
