"""The Ledger page's numbers and its config.json upload (no browser)."""

from __future__ import annotations

import base64
import json

import pytest

from kvdoctor.dashboard import ledger_view
from kvdoctor.dashboard.pages import ledger as page
from kvdoctor.rules.ledger import GPU_CATALOGUE
from kvdoctor.rules.model import COMMON_MODELS

# Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128, bf16 -> 2 x 32 x 8 x 128 x 2 bytes per token.
LLAMA_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def test_baseline_matches_the_design_formulas():
    shape, gpu = COMMON_MODELS["Llama-3.1-8B"], GPU_CATALOGUE["H100"]
    r = ledger_view.report(shape, gpu, context_tokens=8192, batch=16)
    b = r.baseline.ledger
    assert b.kv_bytes_per_token == LLAMA_KV_PER_TOKEN == 131072
    assert b.live_kv_bytes == LLAMA_KV_PER_TOKEN * 8192 * 16
    floor = (shape.weight_bytes + LLAMA_KV_PER_TOKEN * 8192 * 16) / 3350e9
    assert b.step_floor_seconds == pytest.approx(floor)
    assert b.tokens_per_second_per_sequence == pytest.approx(1 / floor)
    assert b.tokens_per_second_total == pytest.approx(16 / floor)
    assert r.pool_bytes == pytest.approx(80e9 * 0.9 - shape.weight_bytes)
    assert r.baseline.fits  # 17.2 GB of KV in ~56 GB


def test_what_if_rows():
    r = ledger_view.report(COMMON_MODELS["Llama-3.1-8B"], GPU_CATALOGUE["H100"], 8192, 16)
    rows = {c.name: c for c in r.what_if}
    assert rows["fp8_kv"].ledger.kv_bytes_per_token == LLAMA_KV_PER_TOKEN / 2
    assert rows["fp8_kv"].flag == "--kv-cache-dtype fp8"
    assert rows["half_context"].ledger.live_kv_bytes == r.baseline.ledger.live_kv_bytes / 2
    mha = ledger_view.report(COMMON_MODELS["Llama-2-7B"], GPU_CATALOGUE["H100"], 4096, 8)
    gqa = next(c for c in mha.what_if if c.name == "gqa_8")
    assert gqa.ledger.kv_bytes_per_token == mha.baseline.ledger.kv_bytes_per_token / 4  # 32 -> 8 KV heads
    fp8 = ledger_view.report(COMMON_MODELS["Llama-3.1-8B"], GPU_CATALOGUE["H100"], 8192, 16, kv_dtype="fp8")
    assert not any(c.name == "fp8_kv" for c in fp8.what_if)


def test_offload_feasibility_and_the_prefetch_hit_rate_needed():
    shape, gpu = COMMON_MODELS["Llama-3.1-70B"], GPU_CATALOGUE["H200"]
    r = ledger_view.report(shape, gpu, 32768, 32, host_bandwidth=300e9)
    o = r.offload
    assert o.overflow_bytes == pytest.approx(r.baseline.ledger.live_kv_bytes - r.pool_bytes)
    assert o.link_bandwidth == gpu.pcie_bandwidth  # PCIe 5 x16 (63 GB/s) is the narrower pipe
    assert o.transfer_seconds_per_step == pytest.approx(o.overflow_bytes / gpu.pcie_bandwidth)
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
    ],
)
def test_out_of_range_inputs_are_refused(kwargs):
    with pytest.raises(ValueError):
        ledger_view.report(COMMON_MODELS["Llama-3.1-8B"], GPU_CATALOGUE["H100"], **kwargs)


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
    result, _what_if, _offload, error = page.compute(page.UPLOADED, shape, "H100", 4096, 4, "auto", 300, 0.9)
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
    *_, error = page.compute("Llama-3.1-8B", None, "H100", None, 4, "auto", 300, 0.9)
    assert error == "fill in every field"
    *_, error = page.compute("Llama-3.1-8B", None, "H100", 4096, 4, "fp7", 300, 0.9)
    assert "unknown dtype" in error
