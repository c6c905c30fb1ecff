"""The Ledger page's numbers and its config.json upload (no browser)."""

from __future__ import annotations

import base64
import json
import math

import pytest

from kvdoctor.dashboard import ledger_view
from kvdoctor.dashboard.pages import ledger as page
from kvdoctor.ledger.gpus import gpu_spec
from kvdoctor.ledger.model import COMMON_MODELS

# Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128, bf16 -> 2 x 32 x 8 x 128 x 2 bytes per token.
LLAMA_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def test_baseline_matches_the_design_formulas():
    shape, gpu = COMMON_MODELS["Llama-3.1-8B"], gpu_spec("NVIDIA H100 80GB HBM3")
    r = ledger_view.report(shape, gpu, context_tokens=8192, batch=16)
    b = r.baseline.ledger
    assert b.kv_bytes_per_token == LLAMA_KV_PER_TOKEN == 131072
    assert b.live_kv_bytes == LLAMA_KV_PER_TOKEN * 8192 * 16
    floor = (shape.weight_bytes + LLAMA_KV_PER_TOKEN * 8192 * 16) / 3350e9
    assert b.step_floor_seconds == pytest.approx(floor)
    assert b.tokens_per_second_per_sequence == pytest.approx(1 / floor)
    assert b.tokens_per_second_total == pytest.approx(16 / floor)
    assert r.pool_bytes == math.ceil(80 * 2**30 * 0.9) - shape.weight_bytes  # vLLM's share of 80 GiB
    assert r.fit.fits and r.baseline.fits  # 17.2 GB of KV in ~61 GB


def test_what_if_rows():
    r = ledger_view.report(COMMON_MODELS["Llama-3.1-8B"], gpu_spec("H100"), 8192, 16)
    rows = {c.name: c for c in r.what_if}
    assert rows["fp8_kv"].ledger.kv_bytes_per_token == LLAMA_KV_PER_TOKEN / 2
    assert rows["fp8_kv"].flag == "--kv-cache-dtype fp8"
    assert rows["half_context"].ledger.live_kv_bytes == r.baseline.ledger.live_kv_bytes / 2
    mha = ledger_view.report(COMMON_MODELS["Llama-2-7B"], gpu_spec("H100"), 4096, 8)
    gqa = next(c for c in mha.what_if if c.name == "gqa_8")
    assert gqa.ledger.kv_bytes_per_token == mha.baseline.ledger.kv_bytes_per_token / 4  # 32 -> 8 KV heads
    fp8 = ledger_view.report(COMMON_MODELS["Llama-3.1-8B"], gpu_spec("H100"), 8192, 16, kv_dtype="fp8")
    assert not any(c.name == "fp8_kv" for c in fp8.what_if)


def test_offload_feasibility_and_the_prefetch_hit_rate_needed():
    shape, gpu = COMMON_MODELS["Llama-3.1-70B"], gpu_spec("H200")
    r = ledger_view.report(shape, gpu, 32768, 32, host_bandwidth=300e9, tp=2)  # 70B needs 2 H200s
    o = r.offload
    assert o.overflow_bytes == pytest.approx(r.baseline.ledger.live_kv_bytes_per_gpu - r.pool_bytes)  # per GPU
    assert o.link_bandwidth == gpu.host_bandwidth == 63e9  # PCIe 5 x16 is the narrower pipe
    assert o.transfer_seconds_per_step == pytest.approx(o.overflow_bytes / 63e9)
    assert not o.hideable
    assert o.prefetch_hit_rate_needed == pytest.approx(1 - o.step_seconds / o.transfer_seconds_per_step)
    small = ledger_view.report(COMMON_MODELS["Llama-3.1-8B"], gpu, 1024, 1)
    assert small.offload.overflow_bytes == 0 and small.offload.prefetch_hit_rate_needed == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(context_tokens=0, batch=1),
        dict(context_tokens=1, batch=0),
        dict(context_tokens=1, batch=1, memory_utilization=1.5),
        dict(context_tokens=1, batch=1, host_bandwidth=0),
        dict(context_tokens=1, batch=1, tp=0),
        dict(context_tokens=1, batch=1, tp=3),  # does not divide Llama-3.1-8B's 32 heads
    ],
)
def test_out_of_range_inputs_are_refused(kwargs):
    with pytest.raises(ValueError):
        ledger_view.report(COMMON_MODELS["Llama-3.1-8B"], gpu_spec("H100"), **kwargs)


def _upload(obj) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return "data:application/json;base64," + base64.b64encode(raw).decode()


QWEN_LIKE = {
    "_name_or_path": "my-model",
    "num_hidden_layers": 28,
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "torch_dtype": "bfloat16",
}


def test_an_uploaded_config_becomes_the_model():
    shape, status, options, value = page.read_upload(_upload(QWEN_LIKE), "config.json", None)
    assert value == page.UPLOADED and options[0] == {"label": "uploaded: my-model", "value": page.UPLOADED}
    assert "28 layers" in status and "4 KV heads" in status
    gpu = "NVIDIA H100 80GB HBM3"
    result, _what_if, _offload, error = page.compute(page.UPLOADED, shape, gpu, 4096, 4, "auto", 300, 0.9, 1)
    assert error is None
    assert "57,344 B" in str(result)  # 2 x 28 x 4 x 128 x 2 bytes per token


@pytest.mark.parametrize(
    "contents, message",
    [
        (_upload(b"not json"), "not JSON"),
        (_upload([1, 2]), "JSON object"),
        (_upload({"hidden_size": 8}), "lacks"),
        ("data:application/json;base64,@@@", "not readable"),
    ],
)
def test_a_bad_upload_says_why_and_keeps_the_model(contents, message):
    store, status, _options, value = page.read_upload(contents, "config.json", None)
    assert message in str(status)
    assert store is value is page.no_update


def test_compute_refuses_missing_fields_with_a_message():
    gpu = "NVIDIA H100 80GB HBM3"
    *_, error = page.compute("Llama-3.1-8B", None, gpu, None, 4, "auto", 300, 0.9, 1)
    assert error == "fill in every field"
    *_, error = page.compute("Llama-3.1-8B", None, gpu, 4096, 4, "fp7", 300, 0.9, 1)
    assert "unknown dtype" in error
    *_, error = page.compute("Llama-3.1-8B", None, "H100", 4096, 4, "auto", 300, 0.9, 1)
    assert error == "pick a GPU"  # the form's values are NVML names


def test_a_deployment_that_does_not_fit_says_so_and_shows_no_floor():
    gpu = "NVIDIA H100 80GB HBM3"
    result, what_if, offload, error = page.compute("Llama-3.1-70B", None, gpu, 8192, 16, "auto", 300, 0.9, 1)
    assert error is None and what_if is None and offload is None
    text = str(result)
    assert "Does not fit: the weights per GPU (141.1 GB) exceed" in text
    assert "The smallest number of tensor-parallel GPUs that fits: 2." in text
    assert "decode step floor" not in text and "KV bytes per token" in text


def test_tensor_parallel_on_the_page_is_per_gpu():
    gpu = "NVIDIA H100 80GB HBM3"
    four = ledger_view.report(COMMON_MODELS["Llama-3.1-70B"], gpu_spec(gpu), 8192, 16, tp=4)
    assert four.fit.fits and four.baseline.ledger.kv_bytes_per_token_per_gpu == 2 * 80 * 2 * 128 * 2
    result, what_if, _offload, error = page.compute("Llama-3.1-70B", None, gpu, 8192, 16, "auto", 300, 0.9, 4)
    assert error is None and "total KV (context x batch) per GPU" in str(result)
    assert "81,920 B" in str(what_if)  # the what-if table's KV per token is per GPU


def test_every_value_says_how_it_was_computed():
    result, *_ = page.compute("Mixtral-8x7B", None, "NVIDIA H200", 4096, 1, "auto", 300, 0.9, 1)
    titles = [c.title for c in _walk(result) if isinstance(getattr(c, "title", None), str)]
    assert any("experts touched at batch 1" in t for t in titles)
    assert any("/ 4,800 GB/s peak" in t for t in titles)


def _walk(component):
    """Every Dash component under ``component`` (strings are not components)."""
    if not hasattr(component, "to_plotly_json"):
        return
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        yield from _walk(child)
