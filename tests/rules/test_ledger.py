"""The ledger's arithmetic, checked by hand, and ``kvdoctor ledger`` on good and bad input.

Llama-3.1-8B (config.json): 32 layers, hidden 4096, 32 heads, 8 KV heads (head_dim 128),
intermediate 14336, vocab 128256, untied embeddings, bf16.

    KV bytes/token  = 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B = 128 KiB (bf16)
                                                  ... x 1 B =  65,536 B =  64 KiB (fp8)
    parameters      = 2 x 128256 x 4096 (embeddings, unembedding)           = 1,050,673,152
                    + 32 x (attention 4096x4096x2 + 4096x1024x2 = 41,943,040
                            + MLP 3 x 4096 x 14336 = 176,160,768 + norms 8192) = 6,979,584,000
                    + final norm 4096                                           = 8,030,261,248
    weights (bf16)  = 16,060,522,496 B
    16 x 8,192 tokens of KV = 131,072 x 131,072 B = 17,179,869,184 B
    step floor on H100 (3,350 GB/s) = (16.0605 + 17.1799) GB / 3,350 GB/s = 9.9225 ms
"""

from __future__ import annotations

import json
import math

import pytest

from kvdoctor import cli
from kvdoctor.rules import ledger as L
from kvdoctor.rules.model import COMMON_MODELS, ModelShape

LLAMA_8B = COMMON_MODELS["Llama-3.1-8B"]
H100 = L.GPU_CATALOGUE["H100"]
LLAMA_8B_CONFIG = {
    "_name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


# ------------------------------------------------------------------------------------- arithmetic


def test_llama_3_1_8b_kv_bytes_per_token():
    assert L.kv_bytes_per_token(LLAMA_8B) == 131_072 == 128 * 1024
    assert L.kv_bytes_per_token(LLAMA_8B, "fp8") == 65_536 == 64 * 1024
    assert L.kv_bytes_per_token(LLAMA_8B, "fp16") == 131_072


def test_llama_3_1_8b_parameters_and_weights():
    assert LLAMA_8B.num_parameters == 8_030_261_248
    assert LLAMA_8B.weight_bytes == 16_060_522_496


def test_llama_3_1_8b_ledger_on_h100():
    ledger = L.compute_ledger(LLAMA_8B, H100.peak_bandwidth, context_tokens=8192, batch=16)
    assert ledger.live_kv_bytes == 17_179_869_184
    assert ledger.step_floor_seconds == pytest.approx((16_060_522_496 + 17_179_869_184) / 3350e9)
    assert ledger.step_floor_seconds == pytest.approx(9.9225e-3, abs=1e-6)
    assert ledger.tokens_per_second_per_sequence == pytest.approx(100.78, abs=0.01)
    assert ledger.tokens_per_second_total == pytest.approx(16 * 100.78, abs=0.2)


def test_the_config_file_and_the_catalogue_agree():
    shape = ModelShape.from_hf_config(LLAMA_8B_CONFIG)
    assert shape.num_parameters == LLAMA_8B.num_parameters
    assert L.kv_bytes_per_token(shape) == L.kv_bytes_per_token(LLAMA_8B)


def test_kv_pool_is_the_engines_share_minus_weights():
    assert L.kv_pool_bytes(LLAMA_8B, H100) == pytest.approx(0.9 * 80e9 - 16_060_522_496)
    assert L.kv_pool_bytes(LLAMA_8B, H100, 0.5, reserve_bytes=2e9) == pytest.approx(40e9 - 16_060_522_496 - 2e9)
    assert L.kv_pool_bytes(COMMON_MODELS["Llama-3.1-70B"], H100) == 0  # 141 GB of weights


def test_forward_flops():
    # one decode token with no context: 2 FLOPs per parameter
    assert L.forward_flops(LLAMA_8B, 1) == 2 * 8_030_261_248
    # attention adds 4 x layers x heads x head_dim per attended token
    assert L.forward_flops(LLAMA_8B, 1, 1000) - L.forward_flops(LLAMA_8B, 1) == 4 * 32 * 32 * 128 * 1000
    assert L.forward_flops(LLAMA_8B, 10, 100) == 10 * L.forward_flops(LLAMA_8B, 1, 100)


def test_every_gpu_has_a_flops_peak():
    for gpu in L.GPU_CATALOGUE.values():
        assert gpu.peak_flops and gpu.peak_flops > 50e12, gpu.name
    assert H100.peak_flops == 989e12


# ------------------------------------------------------------------------------------- what-ifs


def rows_by_name(rows):
    return {row.name: row for row in rows}


def test_what_if_rows_for_llama_3_1_8b():
    rows = rows_by_name(L.what_if_rows(LLAMA_8B, H100, context=8192, batch=16))
    assert list(rows) == ["baseline", "fp8_kv", "half_context"]  # 8 KV heads already: no GQA row
    base, fp8, half = rows["baseline"], rows["fp8_kv"], rows["half_context"]
    assert base.ledger.kv_bytes_per_token == 131_072 and fp8.ledger.kv_bytes_per_token == 65_536
    assert fp8.kv_bytes_per_token_ratio == 0.5 and half.kv_bytes_per_token_ratio == 1.0
    assert fp8.ledger.live_kv_bytes == half.ledger.live_kv_bytes == base.ledger.live_kv_bytes / 2
    # (16.0605 + 8.5899) / (16.0605 + 17.1799) = 0.7416
    assert fp8.step_floor_ratio == pytest.approx(0.7416, abs=1e-4)
    assert fp8.tokens_per_second_ratio == pytest.approx(1 / 0.7416, abs=1e-3)
    assert half.context_tokens == 4096 and half.flag == "--max-model-len 4096"
    assert fp8.flag == "--kv-cache-dtype fp8"
    # pool 55.94 GB / (8192 x 128 KiB = 1.0737 GB) = 52 sequences; twice as many with either change
    assert (base.max_batch, fp8.max_batch, half.max_batch) == (52, 104, 104)
    assert base.fits and base.step_floor_ratio == 1.0


def test_what_if_adds_gqa_for_an_mha_model_and_says_what_does_not_fit():
    mha = COMMON_MODELS["Llama-2-7B"]  # 32 KV heads: 512 KiB per token
    rows = rows_by_name(L.what_if_rows(mha, H100, context=4096, batch=64))
    assert list(rows) == ["baseline", "fp8_kv", "half_context", "gqa_8"]
    gqa = rows["gqa_8"]
    assert gqa.num_kv_heads == 8 and gqa.kv_bytes_per_token_ratio == 0.25
    assert not rows["baseline"].fits and gqa.fits  # 137 GB of KV does not fit; 34 GB does


def test_what_if_skips_fp8_when_the_kv_is_already_fp8():
    rows = L.what_if_rows(LLAMA_8B, H100, context=8192, batch=1, kv_dtype="fp8")
    assert [r.name for r in rows] == ["baseline", "half_context"]


def test_auto_kv_dtype_is_the_models():
    auto = L.what_if_rows(LLAMA_8B, H100, context=8192, batch=1, kv_dtype="auto")
    default = L.what_if_rows(LLAMA_8B, H100, context=8192, batch=1)
    assert auto == default and auto[0].kv_dtype == "bfloat16"
    assert L.offload_feasibility(LLAMA_8B, H100, 8192, 1, "auto") == L.offload_feasibility(LLAMA_8B, H100, 8192, 1)


def test_what_if_refuses_nonsense():
    with pytest.raises(ValueError):
        L.what_if_rows(LLAMA_8B, H100, context=0, batch=1)


def test_what_if_rows_are_json():
    payload = [row.to_json() for row in L.what_if_rows(LLAMA_8B, H100, 1024, 2)]
    assert json.loads(json.dumps(payload))[1]["kv_bytes_per_token"] == 65_536


# ------------------------------------------------------------------------------------- offload


def test_nothing_to_offload_when_the_kv_fits():
    o = L.offload_feasibility(LLAMA_8B, H100, context=8192, batch=16)
    assert o.overflow_bytes == 0 and o.transfer_seconds_per_step == 0
    assert o.hideable and o.prefetch_hit_rate_needed == 0
    # one 8,192-token prefix (1.0737 GB) over PCIe 5 x16 (63 GB/s) = 17.04 ms
    assert o.link_bandwidth == 63e9
    assert o.prefix_load_seconds == pytest.approx(8192 * 131_072 / 63e9)


def test_offload_feasibility_when_the_kv_overflows():
    o = L.offload_feasibility(LLAMA_8B, H100, context=32768, batch=64)
    live = 64 * 32768 * 131_072
    assert o.overflow_bytes == pytest.approx(live - o.pool_bytes)
    assert o.transfer_seconds_per_step == pytest.approx(o.overflow_bytes / 63e9)
    assert o.step_seconds == pytest.approx((16_060_522_496 + o.pool_bytes) / 3350e9)
    assert not o.hideable
    assert o.prefetch_hit_rate_needed == pytest.approx(1 - o.step_seconds / o.transfer_seconds_per_step)
    assert 0.99 < o.prefetch_hit_rate_needed < 1


def test_offload_limited_by_host_memory_when_slower_than_pcie():
    o = L.offload_feasibility(LLAMA_8B, H100, 8192, 1, host_bandwidth=25.6e9)
    assert o.link_bandwidth == 25.6e9


# ------------------------------------------------------------------------------------- the command


def run_ledger(capsys, *args):
    """(exit code, stdout, stderr) of ``kvdoctor ledger ARGS`` run in-process."""
    try:
        rc = cli.main(["ledger", *map(str, args)])
    except SystemExit as exc:  # argparse's own usage errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_ledger_table(capsys):
    rc, out, err = run_ledger(capsys, "--model", "Llama-3.1-8B", "--gpu", "H100", "--context", "8192", "--batch", "16")
    assert rc == 0 and err == ""
    assert "KV bytes per token    128.0 KiB" in out
    assert "decode step floor     9.92 ms" in out
    assert "FP8 KV cache" in out and "64.0 KiB" in out and "--kv-cache-dtype fp8" in out
    assert "half the context" in out and "--max-model-len 4096" in out
    assert "-26%, +35%" in out
    assert "fits in GPU memory?   yes" in out and "52 sequences" in out
    assert "nothing to offload" in out and "17.04 ms" in out


def test_ledger_json_from_a_config_file(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_8B_CONFIG))
    rc, out, _ = run_ledger(
        capsys, "--model", str(config), "--gpu", "NVIDIA H100 80GB HBM3", "--kv-dtype", "fp8", "--json"
    )
    assert rc == 0
    result = json.loads(out)
    assert result["model"]["name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert result["gpu"]["name"] == "H100"
    assert result["kv_bytes_per_token"] == 65_536 and result["kv_dtype"] == "fp8"
    assert [row["name"] for row in result["what_if"]] == ["baseline", "half_context"]
    assert math.isclose(result["step_floor_seconds"], (16_060_522_496 + 16 * 8192 * 65_536) / 3350e9)


def test_ledger_mha_model_shows_the_gqa_row_and_the_offload_need(capsys):
    rc, out, _ = run_ledger(capsys, "--model", "llama-2-7b", "--gpu", "H100", "--context", "4096", "--batch", "64")
    assert rc == 0
    assert "a GQA model with 8 KV heads" in out
    assert "fits in GPU memory?   no" in out
    assert "cannot hide behind the step" in out and "prefetch hit rate" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "missing.json", "--gpu", "H100"], "no such file: 'missing.json'"),
        (["--model", "NOT_JSON", "--gpu", "H100"], "is not JSON"),
        (["--model", "LACKING", "--gpu", "H100"], "model config lacks 'num_hidden_layers'"),
        (["--model", "LIST", "--gpu", "H100"], "is not a model config"),
        (["--model", "Llama-3.1-8B", "--gpu", "Z80"], "unknown GPU 'Z80'"),
        (["--model", "GPT-5", "--gpu", "H100"], "unknown model 'GPT-5'"),
        (["--model", "Llama-3.1-8B", "--gpu", "H100", "--batch", "-1"], "must be a positive integer"),
        (["--model", "Llama-3.1-8B", "--gpu", "H100", "--kv-dtype", "int3"], "invalid choice"),
    ],
)
def test_ledger_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    files = {"NOT_JSON": "this is not json", "LACKING": json.dumps({"hidden_size": 4096}), "LIST": "[1, 2]"}
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    args = [tmp_path / f"{a}.json" if a in files else a for a in args]
    rc, out, err = run_ledger(capsys, *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.slow
def test_ledger_bad_input_through_the_console_script(run_cli, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{")
    result = run_cli("ledger", "--model", bad, "--gpu", "H100")
    assert result.rc == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"kvdoctor ledger: error: '{bad}' is not JSON (Expecting property name enclosed in double quotes at line 1)"
    ]
