"""``load_model_shape``: one loader for a Hugging Face config.json, from a path, bytes or a dict."""

from __future__ import annotations

import json

import pytest

from kvdoctor.rules.model import load_model_shape
from tests.support.models import TINY_CONFIG

CONFIG = TINY_CONFIG


def test_the_same_shape_from_a_path_bytes_and_a_dict(tmp_path):
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(CONFIG))
    from_path = load_model_shape(path)
    assert from_path.name == "tiny-model"  # no _name_or_path: the folder names it
    assert (
        from_path
        == load_model_shape(str(path))
        == load_model_shape(json.dumps(CONFIG).encode(), default_name="tiny-model")
    )
    assert load_model_shape(CONFIG).num_kv_heads == 2 and load_model_shape(CONFIG).dtype == "float16"
    assert load_model_shape({**CONFIG, "_name_or_path": "org/m"}, default_name="x").name == "org/m"


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("{nope", "is not JSON (Expecting property name enclosed in double quotes at line 1)"),
        ("[1, 2]", "is not a model config (expected a JSON object)"),
        (json.dumps({"hidden_size": 8}), "model config lacks 'num_hidden_layers'"),
        (json.dumps({**CONFIG, "num_attention_heads": 0}), "non-positive layer, head or head_dim count"),
        (json.dumps({**CONFIG, "torch_dtype": "fp7"}), "unknown dtype 'fp7'"),
    ],
)
def test_an_unusable_config_is_one_line_naming_the_file(tmp_path, text, phrase):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_model_shape(path)
    message = str(info.value)
    assert phrase in message and str(path) in message and "\n" not in message


def test_a_missing_or_unreadable_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_model_shape(tmp_path / "missing.json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="is not a text file"):
        load_model_shape(tmp_path / "binary.json")
    with pytest.raises(ValueError, match=r"^the config is not JSON"):
        load_model_shape(b"not json")
