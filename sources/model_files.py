"""Where a model's shape comes from: the one loader behind every ``--model``.

``load_model(spec)`` takes what people have:

- a ``config.json`` file;
- a model folder (a Hugging Face snapshot: ``config.json`` and the weights);
- a Hugging Face id already in the local cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``: ``models--org--name/snapshots/<revision>/``); never the network;
- a built-in name (``Llama-3.1-8B``, ``Mixtral-8x7B``, ... ``ledger/model.py``).

Next to a ``config.json`` the weights' exact size is read where the files say it:
``model.safetensors.index.json``'s ``metadata.total_size``, or a single ``model.safetensors``'s
size less its header. ``load_model_shape`` reads a config from a path, its bytes or the parsed
JSON (the dashboard's upload). Every failure is a ``ValueError`` of one line naming the source.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvdoctor.ledger.model import COMMON_MODELS, ModelShape, builtin_model

ConfigSource = str | os.PathLike[str] | bytes | Mapping[str, Any]
CONFIG = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS = "model.safetensors"
_HF_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")


def load_model(spec: str, environ: Mapping[str, str] | None = None) -> ModelShape:
    """The shape ``spec`` names: a config.json, a model folder, a cached Hugging Face id or a
    built-in name (in that order). ``ValueError`` with one line when none fits."""
    found = locate_model(spec, environ)
    if isinstance(found, ModelShape):
        return found
    path, name = found
    shape = load_model_shape(path, default_name=name)
    return replace(shape, name=name) if name else shape


def locate_model(spec: str, environ: Mapping[str, str] | None = None) -> ModelShape | tuple[Path, str]:
    """Where ``spec`` points, without reading the config: (a file or folder, the Hugging Face id
    for a cached one else ""), or the built-in shape. ``ValueError`` with one line when nowhere."""
    environ = os.environ if environ is None else environ
    text = spec.strip()
    if not text:
        raise ValueError("no model given")
    path = Path(text).expanduser()
    if path.exists():
        return path, ""
    cached = find_in_hf_cache(text, environ) if _HF_ID.match(text) and "/" in text else None
    if cached is not None:
        return cached, text
    builtin = builtin_model(text)
    if builtin is not None:
        return builtin
    cached = find_in_hf_cache(text, environ) if _HF_ID.match(text) else None
    if cached is not None:
        return cached, text
    if text.endswith(".json") or text.startswith((os.sep, ".", "~")) or not _HF_ID.match(text):
        raise ValueError(f"no such file {text!r}")
    raise ValueError(
        f"unknown model {text!r}: not a file or folder, not in the local Hugging Face cache "
        f"({hf_hub_cache(environ)}; kvdoctor never downloads), and not a built-in name "
        f"({', '.join(COMMON_MODELS)})"
    )


def read_config(path: Path) -> Mapping[str, Any]:
    """The JSON object of a config.json, or of a model folder's; ``ValueError`` naming the file."""
    where = repr(os.fspath(path))
    if path.is_dir():
        if not (path / CONFIG).is_file():
            raise ValueError(f"{where}: a folder without a {CONFIG}")
        path = path / CONFIG
    return _read_config(path, where)


def load_model_shape(source: ConfigSource, *, default_name: str | None = None, label: str | None = None) -> ModelShape:
    """The shape a Hugging Face ``config.json`` describes.

    ``source``: a config.json path, a model folder, the file's bytes, or the parsed JSON. The name
    is the config's ``_name_or_path``, else ``default_name``, else the folder's name (the
    ``org/name`` of a Hugging Face cache snapshot). Anything unusable raises ``ValueError`` with one
    line naming the source (``label``; default: the quoted path, or "the config").
    """
    path: Path | None = None
    exact = None
    weight_file = ""
    if isinstance(source, (bytes, Mapping)):
        where = label or "the config"
        config = _read_config(source, where)
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            folder = path
            path = folder / CONFIG
            if not path.is_file():
                raise ValueError(f"{label or repr(os.fspath(source))}: a folder without a {CONFIG}")
        where = label or repr(os.fspath(source))
        config = _read_config(path, where)
        exact, weight_file = checkpoint_weight_bytes(path.parent, where)
    name = config.get("_name_or_path") or default_name
    if not name and path is not None:
        name = _folder_name(path.parent) or path.stem
    try:
        shape = ModelShape.from_hf_config(config, name=name, weight_bytes_exact=exact)
        shape.weight_bytes  # noqa: B018 -- an unknown weight dtype fails here, not later
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}" if path is not None or label else str(exc)) from None
    if weight_file:
        shape = replace(shape, weight_source=f"{weight_file}, exactly")
    return replace(shape, source=str(path) if path is not None else where)


def _folder_name(folder: Path) -> str:
    """``org/name`` for a Hugging Face cache snapshot, else the folder's own name."""
    match = _SNAPSHOT.search(folder.as_posix())
    return f"{match['org']}/{match['name']}" if match else folder.name


def _read_config(source: Path | bytes | Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The config as a JSON object; ``where`` names it in errors."""
    config = source if isinstance(source, Mapping) else _read_json(source, where)
    if not isinstance(config, Mapping):
        raise ValueError(f"{where} is not a model config (expected a JSON object)")
    return config


def _read_json(source: Path | bytes, where: str) -> object:
    try:
        text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source.decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"no such file {where}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not a text file") from None
    except OSError as exc:
        raise ValueError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not JSON ({exc.msg} at line {exc.lineno})") from None


# ---------------------------------------------------------------------------- the weights' size


def checkpoint_weight_bytes(folder: Path, where: str = "") -> tuple[float | None, str]:
    """(the checkpoint's tensor bytes, the file that says so), or (None, "") where no safetensors
    file is there. The index's ``metadata.total_size`` is the sum of every tensor's bytes."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        data = _read_json(index, repr(os.fspath(index)))
        total = data.get("metadata", {}).get("total_size") if isinstance(data, Mapping) else None
        if not isinstance(total, (int, float)) or total <= 0:
            raise ValueError(f"{where or index}: {SAFETENSORS_INDEX} has no metadata.total_size")
        return float(total), f"{SAFETENSORS_INDEX} metadata.total_size"
    single = folder / SAFETENSORS
    if single.is_file():
        return float(_safetensors_tensor_bytes(single)), f"{SAFETENSORS} size less its header"
    return None, ""


def _safetensors_tensor_bytes(path: Path) -> int:
    """A safetensors file is an 8-byte little-endian header length, the JSON header, then the
    tensors back to back: their bytes are the file's size less the first two."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    if len(head) < 8:
        raise ValueError(f"{str(path)!r} is not a safetensors file")
    (header_len,) = struct.unpack("<Q", head)
    if header_len + 8 > size:
        raise ValueError(f"{str(path)!r} is not a safetensors file")
    return int(size - 8 - header_len)


# ------------------------------------------------------------------------ the Hugging Face cache


def hf_hub_cache(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(var):
            return Path(environ[var]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    return cache / "huggingface" / "hub"


def find_in_hf_cache(repo_id: str, environ: Mapping[str, str]) -> Path | None:
    """The snapshot folder of ``repo_id`` in the local cache: the one ``refs/main`` names, else the
    newest; None when the model is not cached."""
    repo = hf_hub_cache(environ) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text(encoding="utf-8").strip()
        if pinned.is_dir():
            return pinned
    candidates = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None
