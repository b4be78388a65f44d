"""Text encoder folders from the internet: refused in one line before anything in them runs or unpickles."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.text_helpers import save_tiny_t5

pytest.importorskip("transformers")

from dit_trainer.errors import DataError  # noqa: E402
from dit_trainer.text_encoders import load_text_encoder, resolve_folders  # noqa: E402


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return save_tiny_t5(tmp_path_factory.mktemp("t5") / "t5")


def _copy(t5, tmp_path, name="copy"):
    folder = tmp_path / name
    shutil.copytree(t5, folder)
    return folder


def _plant_code(folder, json_name):
    """An auto_map entry whose module, if ever imported, leaves a marker file."""
    marker = folder / "ran.txt"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Evil: pass\n")
    path = folder / json_name
    data = json.loads(path.read_text())
    data["auto_map"] = {"AutoModel": "evil.Evil", "AutoTokenizer": ["evil.Evil", None]}
    path.write_text(json.dumps(data))
    return marker


@pytest.mark.parametrize("json_name", ["config.json", "tokenizer_config.json"])
def test_a_folder_asking_for_its_own_code_is_refused_and_nothing_runs(t5, tmp_path, json_name):
    folder = _copy(t5, tmp_path)
    marker = _plant_code(folder, json_name)
    with pytest.raises(DataError, match="auto_map") as err:
        load_text_encoder(str(folder))
    assert str(folder / json_name) in str(err.value) and "never runs" in str(err.value)
    assert "\n" not in str(err.value) and not marker.exists()


def test_pickled_weights_only_are_refused_naming_the_file(t5, tmp_path):
    folder = _copy(t5, tmp_path)
    os.remove(folder / "model.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"not even read")
    with pytest.raises(DataError, match="pickled weights") as err:
        load_text_encoder(str(folder))
    assert str(folder / "pytorch_model.bin") in str(err.value) and "safetensors" in str(err.value)


def test_pipeline_folder_reads_text_encoder_beside_tokenizer(t5, tmp_path):
    pipeline = tmp_path / "pipeline"
    (pipeline / "text_encoder").mkdir(parents=True)
    (pipeline / "tokenizer").mkdir()
    for name in os.listdir(t5):
        target = "tokenizer" if "token" in name else "text_encoder"
        shutil.copy(os.path.join(t5, name), pipeline / target / name)
    name, model, tokenizer, config = resolve_folders(str(pipeline))
    assert (model, tokenizer) == (str(pipeline / "text_encoder"), str(pipeline / "tokenizer"))
    assert name == str(pipeline) and config["model_type"] == "t5"
    assert load_text_encoder(str(pipeline)).encode(["a cat"])["text_embeds"].shape == (1, 120, 32)


def test_missing_folder_and_folder_without_tokenizer(t5, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_text_encoder(str(tmp_path / "nowhere" / "t5"))
    folder = _copy(t5, tmp_path)
    for name in ("tokenizer_config.json", "added_tokens.json"):
        os.remove(folder / name)
    with pytest.raises(DataError, match="holds no tokenizer"):
        load_text_encoder(str(folder))


def test_offline_hub_id_is_one_line_naming_the_download(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONWARNINGS": "ignore"}
    code = ("from dit_trainer.text_encoders import load_text_encoder\n"
            "from dit_trainer.errors import DataError\n"
            "try:\n    load_text_encoder('google/t5-v1_1-xxl')\nexcept DataError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = proc.stdout.splitlines()
    assert "`hf download google/t5-v1_1-xxl --local-dir DIR`" in line and "not in the Hugging Face cache" in line
