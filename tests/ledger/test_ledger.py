"""The ledger's arithmetic, checked by hand: dense, MoE, MLA, tensor parallelism, fit, capacity.

Llama-3.1-8B (config.json): 32 layers, hidden 4096, 32 heads, 8 KV heads (head_dim 128),
intermediate 14336, vocab 128256, untied embeddings, bf16.

    KV bytes/token  = 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B = 128 KiB (bf16)
    parameters      = 2 x 128256 x 4096 (embeddings, unembedding)           = 1,050,673,152
                    + 32 x (attention 41,943,040 + MLP 176,160,768 + norms 8192) = 6,979,584,000
                    + final norm 4096                                           = 8,030,261,248
    weights (bf16)  = 16,060,522,496 B
    16 x 8,192 tokens of KV = 17,179,869,184 B
    step floor on H100 SXM (3,350 GB/s) = (16.0605 + 17.1799) GB / 3,350 GB/s = 9.9225 ms
    H100 SXM memory 80 GiB; vLLM's share at 0.9 = ceil(0.9 x 85,899,345,920) = 77,309,411,328 B
    KV pool = 77,309,411,328 - 16,060,522,496 = 61,248,888,832 B; a 16-token block = 2 MiB
    -> 29,205 blocks; 8,192 tokens = 512 blocks: 57.04x concurrency, 57 sequences, 467,280 tokens
"""

from __future__ import annotations

import json
import math

import pytest

from kvdoctor.ledger import arithmetic as L
from kvdoctor.ledger.gpus import GPUS, gpu_spec
from kvdoctor.ledger.model import BUILTIN_CONFIGS, COMMON_MODELS, ModelShape
from kvdoctor.ledger.whatif import offload_feasibility, what_if_rows

LLAMA_8B = COMMON_MODELS["Llama-3.1-8B"]
LLAMA_70B = COMMON_MODELS["Llama-3.1-70B"]
MIXTRAL = COMMON_MODELS["Mixtral-8x7B"]
DEEPSEEK_V3 = COMMON_MODELS["DeepSeek-V3"]
H100 = gpu_spec("NVIDIA H100 80GB HBM3")
POOL_8B = 77_309_411_328 - 16_060_522_496


# ------------------------------------------------------------------------------------- dense


def test_llama_3_1_8b_kv_bytes_per_token():
    assert L.kv_bytes_per_token(LLAMA_8B) == 131_072 == 128 * 1024
    assert L.kv_bytes_per_token(LLAMA_8B, "fp8") == 65_536
    assert L.kv_bytes_per_token(LLAMA_8B, "fp16") == 131_072 == L.kv_bytes_per_token(LLAMA_8B, "auto")


def test_llama_3_1_8b_parameters_and_weights():
    assert LLAMA_8B.num_parameters == 8_030_261_248
    assert LLAMA_8B.weight_bytes == 16_060_522_496
    assert L.weight_bytes_per_step(LLAMA_8B, 1) == L.weight_bytes_per_step(LLAMA_8B, 256) == LLAMA_8B.weight_bytes


def test_llama_3_1_8b_ledger_on_h100():
    ledger = L.compute_ledger(LLAMA_8B, H100.peak_bandwidth, context_tokens=8192, batch=16)
    assert ledger.live_kv_bytes == ledger.live_kv_bytes_per_gpu == 17_179_869_184
    assert ledger.weight_bytes_per_step == ledger.weight_bytes == 16_060_522_496
    assert ledger.step_floor_seconds == pytest.approx((16_060_522_496 + 17_179_869_184) / 3350e9)
    assert ledger.step_floor_seconds == pytest.approx(9.9225e-3, abs=1e-6)
    assert ledger.tokens_per_second_per_sequence == pytest.approx(100.78, abs=0.01)
    assert ledger.tokens_per_second_total == pytest.approx(16 * 100.78, abs=0.2)


def test_forward_flops():
    assert L.forward_flops(LLAMA_8B, 1) == 2 * 8_030_261_248
    assert L.forward_flops(LLAMA_8B, 1, 1000) - L.forward_flops(LLAMA_8B, 1) == 4 * 32 * 32 * 128 * 1000


# ------------------------------------------------------------------------------- mixture of experts


def test_mixtral_parameters_and_one_expert():
    # 32 layers x 8 experts x 3 x 4096 x 14336 = 45.1 B of 46.7 B parameters are routed experts
    assert MIXTRAL.num_parameters == pytest.approx(46.7e9, rel=0.001)
    assert (MIXTRAL.num_experts, MIXTRAL.experts_per_token, MIXTRAL.moe_layers) == (8, 2, 32)
    assert MIXTRAL.expert_bytes == 3 * 4096 * 14336 * 2 == 352_321_536


def test_expected_experts_touched():
    assert L.expected_experts_touched(8, 2, 1) == 2  # one token: exactly k
    assert L.expected_experts_touched(8, 2, 2) == 8 * (1 - 0.75**2) == 3.5
    assert 7.999 < L.expected_experts_touched(8, 2, 64) < 8
    assert L.expected_experts_touched(256, 8, 1) == pytest.approx(8)


def test_mixtral_reads_a_quarter_of_its_weights_at_batch_1_and_nearly_all_at_batch_64():
    routed = 32 * 8 * 352_321_536
    shared = MIXTRAL.weight_bytes - routed
    at_1 = L.weight_bytes_per_step(MIXTRAL, 1)
    assert at_1 == pytest.approx(shared + 32 * 2 * 352_321_536)
    assert 24e9 <= at_1 <= 28e9
    at_64 = L.weight_bytes_per_step(MIXTRAL, 64)
    assert 90e9 <= at_64 <= 95e9 and at_64 < MIXTRAL.weight_bytes
    assert L.weight_bytes_per_step(MIXTRAL, 2) == pytest.approx(shared + 32 * 3.5 * 352_321_536)


def test_the_moe_floor_uses_the_weights_read_per_step():
    ledger = L.compute_ledger(MIXTRAL, H100.peak_bandwidth, 1024, batch=1, tp=2)
    assert ledger.weight_bytes_per_step == L.weight_bytes_per_step(MIXTRAL, 1)
    per_gpu_kv = 2 * 32 * 4 * 128 * 2 * 1024  # 4 of 8 KV heads per GPU
    assert ledger.step_floor_seconds == pytest.approx((ledger.weight_bytes_per_step / 2 + per_gpu_kv) / 3350e9)


def test_deepseek_v3_mla_kv_per_token_and_fp8_weights():
    assert L.kv_bytes_per_token(DEEPSEEK_V3) == (512 + 64) * 61 * 2 == 70_272
    assert DEEPSEEK_V3.weight_dtype == "fp8" and DEEPSEEK_V3.dtype == "bfloat16"
    assert DEEPSEEK_V3.num_parameters == pytest.approx(671e9, rel=0.002)
    assert DEEPSEEK_V3.moe_layers == 58 and DEEPSEEK_V3.num_experts == 256  # the first 3 layers are dense
    # the MLA latent is replicated on every GPU, not split like KV heads
    assert L.kv_bytes_per_token_per_gpu(DEEPSEEK_V3, 8) == 70_272


# ------------------------------------------------------------------------------ tensor parallelism


def test_tensor_parallel_splits_kv_heads_and_replicates_them_below_one_per_gpu():
    assert L.kv_heads_per_gpu(LLAMA_70B, 4) == 2
    assert L.kv_bytes_per_token_per_gpu(LLAMA_70B, 4) == 2 * 80 * 2 * 128 * 2 == 81_920
    assert L.kv_heads_per_gpu(LLAMA_70B, 16) == 1  # 8 KV heads over 16 GPUs: each keeps one
    ledger = L.compute_ledger(LLAMA_70B, H100.peak_bandwidth, 1000, batch=1, tp=16)
    assert ledger.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2
    assert ledger.live_kv_bytes == 16 * ledger.live_kv_bytes_per_gpu == 2 * ledger.kv_bytes_per_token * 1000


def test_tensor_parallel_sizes_follow_vllms_rule():
    assert L.tensor_parallel_sizes(LLAMA_70B, 64) == [1, 2, 4, 8, 16, 32, 64]
    qwen = COMMON_MODELS["Qwen2.5-7B"]  # 28 heads, 4 KV heads
    assert L.tensor_parallel_sizes(qwen) == [1, 2, 4, 28]
    with pytest.raises(ValueError, match="does not divide the model's 64 attention heads"):
        L.check_tensor_parallel(LLAMA_70B, 3)
    with pytest.raises(ValueError, match="nor is a multiple"):
        L.check_tensor_parallel(qwen, 14)


def test_the_floor_is_per_gpu():
    one = L.compute_ledger(LLAMA_70B, H100.peak_bandwidth, 8192, 16, tp=1)
    four = L.compute_ledger(LLAMA_70B, H100.peak_bandwidth, 8192, 16, tp=4)
    assert four.weight_bytes_per_step_per_gpu == LLAMA_70B.weight_bytes / 4
    assert four.step_floor_seconds == pytest.approx(one.step_floor_seconds / 4)


def test_all_reduce_cost():
    assert L.all_reduce_cost(LLAMA_70B, H100, 16, 1) is None
    cost = L.all_reduce_cost(LLAMA_70B, H100, 16, 4)
    assert cost.count_per_step == 160
    assert cost.bytes_per_gpu == 160 * 16 * 8192 * 2 * 2 * 3 / 4
    assert cost.link_bandwidth == 450e9 and "NVLink" in cost.link  # 900 GB/s total: 450 each way
    l4 = L.all_reduce_cost(LLAMA_70B, gpu_spec("L4"), 16, 4)
    assert l4.link_bandwidth == 31.5e9 and l4.link.startswith("PCIe 4.0")


# ----------------------------------------------------------------------------- fit and capacity


def test_the_kv_pool_is_vllms_share_minus_the_weights():
    assert L.kv_pool_bytes(LLAMA_8B, H100) == POOL_8B
    assert L.kv_pool_bytes(LLAMA_8B, H100, 0.5, reserve_bytes=2e9) == 42_949_672_960 - 16_060_522_496 - 2e9
    assert L.kv_pool_bytes(LLAMA_70B, H100) == 0  # 141 GB of weights
    assert L.kv_pool_bytes(LLAMA_70B, H100, tp=2) == 77_309_411_328 - LLAMA_70B.weight_bytes / 2


def test_capacity_is_counted_as_vllm_counts_it():
    cap = L.kv_capacity(LLAMA_8B, POOL_8B, 8192, block_size=16)
    assert cap.bytes_per_block == 16 * 131_072
    assert cap.num_blocks == POOL_8B // (16 * 131_072) == 29_205
    assert cap.blocks_per_sequence == 512 and cap.sequences == 57
    assert cap.max_concurrency == 29_205 / 512
    assert cap.tokens == 467_280 == 29_205 * 16  # the block size divides the context


def test_capacity_when_the_context_is_not_a_multiple_of_the_block():
    """vLLM: concurrency = blocks / ceil(len / block); tokens = int(concurrency x len)."""
    tiny = ModelShape("tiny", 4, 256, 4, 2, 64, "float32", 1e6)  # 4 KiB of KV per token
    cap = L.kv_capacity(tiny, 20_000_000, 1000, block_size=128)
    assert cap.num_blocks == 20_000_000 // (128 * 4096) == 38
    assert cap.blocks_per_sequence == 8 and cap.max_concurrency == 4.75
    assert cap.tokens == 4750 != 38 * 128 and cap.sequences == 4


def test_70b_on_one_80gb_gpu_does_not_fit_and_suggests_tp_2():
    fit = L.check_fit(L.Deployment(LLAMA_70B, H100, 8192, tp=1))
    assert not fit.fits and fit.suggested_tp == 2
    assert "weights per GPU (141.1 GB) exceed the engine's share" in fit.reason
    two, four = (
        L.check_fit(L.Deployment(LLAMA_70B, H100, 8192, tp=2)),
        L.check_fit(L.Deployment(LLAMA_70B, H100, 8192, tp=4)),
    )
    assert two.fits and four.fits and two.reason == "" and four.suggested_tp is None
    assert four.capacity.sequences > two.capacity.sequences > 0


def test_a_pool_smaller_than_one_sequence_does_not_fit():
    fit = L.check_fit(L.Deployment(LLAMA_8B, H100, 8192, kv_cache_memory_bytes=512 * 1024 * 1024))  # 4,096 tokens
    assert not fit.fits and "less than one sequence of 8,192 tokens" in fit.reason
    assert fit.suggested_tp == 2  # two GPUs hold half the KV heads each: 8,192 tokens fit
    assert L.check_fit(L.Deployment(LLAMA_8B, H100, 4096, kv_cache_memory_bytes=512 * 1024 * 1024)).fits


def test_nothing_fits_a_model_bigger_than_64_gpus():
    huge = ModelShape.from_hf_config({**BUILTIN_CONFIGS["Llama-3.1-8B"], "num_hidden_layers": 20000})
    fit = L.check_fit(L.Deployment(huge, H100, 8192))
    assert not fit.fits and fit.suggested_tp is None


# ------------------------------------------------------------------------------------- what-ifs


def rows_by_name(rows):
    return {row.name: row for row in rows}


def test_what_if_rows_for_llama_3_1_8b():
    rows = rows_by_name(what_if_rows(L.Deployment(LLAMA_8B, H100, context=8192, batch=16)))
    assert list(rows) == ["baseline", "fp8_kv", "half_context"]  # 8 KV heads already: no GQA row
    base, fp8, half = rows["baseline"], rows["fp8_kv"], rows["half_context"]
    assert base.ledger.kv_bytes_per_token == 131_072 and fp8.ledger.kv_bytes_per_token == 65_536
    assert fp8.kv_bytes_per_token_ratio == 0.5 and half.kv_bytes_per_token_ratio == 1.0
    assert fp8.ledger.live_kv_bytes == half.ledger.live_kv_bytes == base.ledger.live_kv_bytes / 2
    assert fp8.step_floor_ratio == pytest.approx(0.7416, abs=1e-4)  # (16.06 + 8.59) / (16.06 + 17.18)
    assert half.context_tokens == 4096 and half.flag == "--max-model-len 4096"
    # 29,205 blocks hold 57 sequences of 512 blocks; FP8 doubles the blocks, half the context halves the need
    assert (base.max_batch, fp8.max_batch, half.max_batch) == (57, 114, 114)
    assert base.fits and base.step_floor_ratio == 1.0


def test_what_if_adds_gqa_for_an_mha_model_and_says_what_does_not_fit():
    mha = COMMON_MODELS["Llama-2-7B"]  # 32 KV heads: 512 KiB per token
    rows = rows_by_name(what_if_rows(L.Deployment(mha, H100, context=4096, batch=64)))
    assert list(rows) == ["baseline", "fp8_kv", "half_context", "gqa_8"]
    assert rows["gqa_8"].num_kv_heads == 8 and rows["gqa_8"].kv_bytes_per_token_ratio == 0.25
    assert not rows["baseline"].fits and rows["gqa_8"].fits  # 137 GB of KV does not fit; 34 GB does


def test_what_if_skips_fp8_when_the_kv_is_already_fp8_and_refuses_nonsense():
    assert [r.name for r in what_if_rows(L.Deployment(LLAMA_8B, H100, 8192, 1, "fp8"))] == ["baseline", "half_context"]
    assert what_if_rows(L.Deployment(LLAMA_8B, H100, 8192, 1, "auto")) == what_if_rows(
        L.Deployment(LLAMA_8B, H100, 8192, 1)
    )
    with pytest.raises(ValueError):
        what_if_rows(L.Deployment(LLAMA_8B, H100, context=0, batch=1))
    payload = [row.to_json() for row in what_if_rows(L.Deployment(LLAMA_8B, H100, 1024, 2))]
    assert json.loads(json.dumps(payload))[1]["kv_bytes_per_token"] == 65_536


# ------------------------------------------------------------------------------------- offload


def test_nothing_to_offload_when_the_kv_fits():
    o = offload_feasibility(L.Deployment(LLAMA_8B, H100, context=8192, batch=16))
    assert o.overflow_bytes == 0 and o.transfer_seconds_per_step == 0 and o.hideable
    assert o.link_bandwidth == 63e9  # PCIe 5.0 x16, narrower than 8 channels of DDR5
    assert o.prefix_load_seconds == pytest.approx(8192 * 131_072 / 63e9)


def test_offload_feasibility_when_the_kv_overflows():
    o = offload_feasibility(L.Deployment(LLAMA_8B, H100, context=32768, batch=64))
    assert o.overflow_bytes == 64 * 32768 * 131_072 - POOL_8B
    assert o.transfer_seconds_per_step == pytest.approx(o.overflow_bytes / 63e9)
    assert o.step_seconds == pytest.approx((16_060_522_496 + POOL_8B) / 3350e9)
    assert not o.hideable and 0.99 < o.prefetch_hit_rate_needed < 1
    assert o.prefetch_hit_rate_needed == pytest.approx(1 - o.step_seconds / o.transfer_seconds_per_step)


def test_offload_uses_the_host_link_of_the_gpu():
    assert offload_feasibility(L.Deployment(LLAMA_8B, H100, 8192, 1, host_bandwidth=25.6e9)).link_bandwidth == 25.6e9
    gh200 = offload_feasibility(L.Deployment(LLAMA_8B, gpu_spec("GH200-96GB"), 8192, 1))
    assert gh200.link_bandwidth == min(L.DEFAULT_HOST_BANDWIDTH, 450e9)  # NVLink-C2C, not PCIe


def test_floors_are_finite_for_every_builtin_model_on_every_gpu_it_fits():
    for shape in COMMON_MODELS.values():
        for gpu in GPUS:
            fit = L.check_fit(L.Deployment(shape, gpu, 4096), suggest=False)
            if fit.fits:
                ledger = L.compute_ledger(shape, gpu.peak_bandwidth, 4096, 4)
                assert math.isfinite(ledger.step_floor_seconds) and ledger.step_floor_seconds > 0
