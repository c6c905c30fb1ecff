"""``kvdoctor ledger``: fit first, labelled figures, the same names in --json, exit codes, bad input.

Run in-process through ``kvdoctor.cli.main`` (the console script is checked once, slow).
"""

from __future__ import annotations

import json

import pytest

from kvdoctor import cli
from kvdoctor.ledger.model import BUILTIN_CONFIGS
from tests.support.models import TINY_CONFIG


def run_ledger(capsys, *args):
    """(exit code, stdout, stderr) of ``kvdoctor ledger ARGS`` run in-process."""
    try:
        rc = cli.main(["ledger", *map(str, args)])
    except SystemExit as exc:  # argparse's own usage errors and --list-gpus
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def ledger_json(capsys, *args, rc=0):
    code, out, err = run_ledger(capsys, *args, "--json")
    assert code == rc, err
    return json.loads(out)


@pytest.fixture(autouse=True)
def empty_hf_cache(monkeypatch, tmp_path):
    """No test reads the machine's own Hugging Face cache."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return tmp_path / "hf-cache"


def test_a_dense_model_on_h100_sxm(capsys):
    rc, out, err = run_ledger(
        capsys, "--model", "Llama-3.1-8B", "--gpu", "NVIDIA H100 80GB HBM3", "--context", 8192, "--batch", 16
    )
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("Llama-3.1-8B (32 layers, 8 KV heads of 32) on NVIDIA H100 80GB HBM3 (H100 SXM 80GB")
    assert lines[2].startswith("fits: yes. Each GPU's KV pool (61.2 GB) holds 57 sequences of 8,192 tokens")
    assert "KV bytes per token" in out and "131,072 B (128.0 KiB)" in out
    assert "2 (K and V) x 32 layers x 8 KV heads x 128 head dim x 2 B (bfloat16)" in out
    floor = next(line for line in lines if line.startswith("  decode step floor "))
    assert (
        "9.92 ms" in floor and "all 16 sequences resident: (weights read per step 16.1 GB + live KV 17.2 GB)" in floor
    )
    assert floor.endswith("/ 3,350 GB/s peak (catalogue: H100 SXM 80GB)")
    assert "FP8 KV cache" in out and "-26%, +35%   --kv-cache-dtype fp8" in out
    assert "nothing to offload" in out and "17.04 ms" in out


def test_json_uses_the_figures_names_and_every_figure_says_how(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**BUILTIN_CONFIGS["Llama-3.1-8B"], "_name_or_path": "meta-llama/Llama-3.1-8B"}))
    result = ledger_json(capsys, "--model", config, "--gpu", "H100 SXM", "--kv-dtype", "fp8")
    assert result["model"]["name"] == "meta-llama/Llama-3.1-8B" and result["gpu"]["name"] == "NVIDIA H100 80GB HBM3"
    assert result["fits"] is True and result["reason"] == "" and result["suggestion"] is None
    assert result["kv_bytes_per_token"] == 65_536 and result["kv_dtype"] == "fp8"
    assert result["weight_bytes_per_step"] == result["weight_bytes"] == 16_060_522_496  # dense
    assert [row["name"] for row in result["what_if"]] == ["baseline", "half_context"]
    assert result["step_floor_seconds"] == pytest.approx((16_060_522_496 + 16 * 8192 * 65_536) / 3350e9)
    for figure in result["figures"]:
        assert result[figure["name"]] == figure["value"]
        assert figure["label"] and figure["how"] and figure["unit"]


def test_moe_reads_its_weights_per_step_by_batch(capsys):
    one = ledger_json(
        capsys, "--model", "Mixtral-8x7B", "--gpu", "H100 SXM", "--tp", 2, "--batch", 1, "--context", 4096
    )
    many = ledger_json(
        capsys, "--model", "Mixtral-8x7B", "--gpu", "H100 SXM", "--tp", 2, "--batch", 64, "--context", 4096
    )
    assert 24e9 <= one["weight_bytes_per_step"] <= 28e9 and 90e9 <= many["weight_bytes_per_step"] <= 95e9
    assert one["weight_bytes"] == many["weight_bytes"] == pytest.approx(93.4e9, rel=0.001)
    # the floor uses the bytes read: at batch 1, half of 25.8 GB per GPU plus the KV
    kv = one["kv_bytes_per_token_per_gpu"] * 4096
    assert one["step_floor_seconds"] == pytest.approx((one["weight_bytes_per_step"] / 2 + kv) / 3350e9)
    how = next(f["how"] for f in one["figures"] if f["name"] == "weight_bytes_per_step")
    assert "32 MoE layers x 2.00 of 8 experts touched at batch 1 (8 x (1 - (1 - 2/8)^1))" in how


def test_mla_kv_per_token_from_the_latent(capsys):
    result = ledger_json(
        capsys, "--model", "DeepSeek-V3", "--gpu", "H200 SXM", "--tp", 8, "--context", 4096, "--batch", 4
    )
    assert result["kv_bytes_per_token"] == result["kv_bytes_per_token_per_gpu"] == 70_272
    assert result["fits"] and result["model"]["kv_latent_dim"] == 576


def test_70b_on_one_gpu_does_not_fit_first_and_exits_1(capsys):
    rc, out, _ = run_ledger(capsys, "--model", "Llama-3.1-70B", "--gpu", "H100 SXM", "--tp", 1)
    assert rc == 1
    lines = out.splitlines()
    assert lines[2].startswith("DOES NOT FIT: the weights per GPU (141.1 GB) exceed the engine's share")
    assert lines[3] == "  smallest --tp that fits: 2 (run again with --tp 2)"
    assert "decode step floor" not in out and "what if" not in out
    assert "KV bytes per token" in out and "weights" in out
    result = ledger_json(capsys, "--model", "Llama-3.1-70B", "--gpu", "H100 SXM", rc=1)
    assert result["fits"] is False and "exceed the engine's share" in result["reason"]
    assert result["suggestion"] == {"tp": 2, "flag": "--tp 2"}
    assert result["kv_bytes_per_token"] == 327_680 and result["weight_bytes"] == pytest.approx(141.1e9, rel=0.001)
    assert "step_floor_seconds" not in result and result["what_if"] == [] and result["offload"] is None


def test_70b_on_four_gpus_is_per_gpu_with_the_all_reduce(capsys):
    rc, out, _ = run_ledger(capsys, "--model", "Llama-3.1-70B", "--gpu", "H100 SXM", "--tp", 4)
    assert rc == 0 and "fits: yes" in out
    assert "2 of the 8 KV heads on each of 4 GPUs" in out and "weights / 4 GPUs" in out
    assert "all-reduce per step (not in the floor)" in out and "NVLink (450.0 GB/s per direction)" in out
    assert "latency is not counted" in out
    result = ledger_json(capsys, "--model", "Llama-3.1-70B", "--gpu", "H100 SXM", "--tp", 4)
    assert result["tp"] == 4 and result["kv_bytes_per_token_per_gpu"] == 81_920
    assert result["live_kv_bytes_per_gpu"] == 16 * 8192 * 81_920
    assert result["step_floor_seconds"] == pytest.approx((result["weight_bytes"] / 4 + 16 * 8192 * 81_920) / 3350e9)


def test_a_model_folder_gives_its_exact_weight_bytes(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BUILTIN_CONFIGS["Llama-3.1-8B"]))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16_060_522_600}}))
    result = ledger_json(capsys, "--model", tmp_path, "--gpu", "L40S")
    assert result["weight_bytes"] == 16_060_522_600
    assert result["model"]["weight_source"] == "model.safetensors.index.json metadata.total_size, exactly"


def test_a_cached_hugging_face_id(capsys, empty_hf_cache):
    snapshot = empty_hf_cache / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "a09a354"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(BUILTIN_CONFIGS["Qwen2.5-7B"]))
    result = ledger_json(capsys, "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L4", "--context", 4096)
    assert result["model"]["name"] == "Qwen/Qwen2.5-7B-Instruct" and result["kv_bytes_per_token"] == 57_344


def test_capacity_with_a_fixed_kv_memory_like_vllm(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_CONFIG, "torch_dtype": "float32"}))
    args = ("--model", tmp_path, "--gpu-peak-bandwidth", 1e11, "--gpu-memory-bytes", 64e9, "--block-size", 128)
    result = ledger_json(capsys, *args, "--kv-cache-memory-bytes", 16_777_216, "--context", 2048)
    assert result["gpu"]["name"] == "custom" and result["gpu"]["peak_source"] == "--gpu-peak-bandwidth"
    assert (result["kv_cache_tokens"], result["max_concurrency"], result["sequences_that_fit"]) == (4096, 2.0, 2)
    assert result["kv_pool_bytes"] == 16_777_216 and result["gpu_memory_utilization"] is None
    odd = ledger_json(capsys, *args, "--kv-cache-memory-bytes", 20_000_000, "--context", 1000)
    assert (odd["kv_cache_tokens"], odd["max_concurrency"]) == (4750, 4.75)


def test_the_gpu_catalogue_lists_every_row(capsys):
    rc, out, _ = run_ledger(capsys, "--list-gpus")
    assert rc == 0 and "NVIDIA GH200 144G HBM3e" in out and "Tesla T4" in out and "NVLink-C2C" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "missing.json", "--gpu", "H100 SXM"], "no such file 'missing.json'"),
        (["--model", "NOT_JSON", "--gpu", "H100 SXM"], "is not JSON"),
        (["--model", "LACKING", "--gpu", "H100 SXM"], "model config lacks 'num_hidden_layers'"),
        (["--model", "NO_INTERMEDIATE", "--gpu", "H100 SXM"], "model config lacks 'intermediate_size'"),
        (["--model", "LIST", "--gpu", "H100 SXM"], "is not a model config"),
        (["--model", "Llama-3.1-8B", "--gpu", "Z80"], "unknown GPU 'Z80'"),
        (["--model", "Llama-3.1-8B", "--gpu", "NVIDIA H900"], "(closest: 'NVIDIA H800', 'NVIDIA H200'"),
        (["--model", "Llama-3.1-8B"], "give --gpu NAME"),
        (["--model", "Llama-3.1-8B", "--gpu-peak-bandwidth", "2e12"], "--gpu-memory-bytes"),
        (["--model", "GPT-5", "--gpu", "H100 SXM"], "unknown model 'GPT-5'"),
        (["--model", "Llama-3.1-70B", "--gpu", "H100 SXM", "--tp", "3"], "--tp 3 does not divide"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_json_stays_parseable(tmp_path, capsys, args, message):
    config = {k: v for k, v in TINY_CONFIG.items() if k != "intermediate_size"}
    files = {
        "NOT_JSON": "nope",
        "LACKING": '{"hidden_size": 4096}',
        "LIST": "[1]",
        "NO_INTERMEDIATE": json.dumps(config),
    }
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    args = [tmp_path / f"{a}.json" if a in files else a for a in args]
    rc, out, err = run_ledger(capsys, *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err
    rc, out, err = run_ledger(capsys, *args, "--json")
    assert rc == 2 and json.loads(out) == {
        "error": err.strip().removeprefix("kvdoctor ledger: error: "),
        "exit_code": 2,
    }


@pytest.mark.parametrize(
    "args",
    [
        ["--batch", "-1"],
        ["--gpu-memory-utilization", "1.5"],
        ["--kv-cache-memory-bytes", "1e9", "--gpu-memory-utilization", "0.8"],
        ["--kv-dtype", "int3"],
    ],
)
def test_argument_errors_exit_2(capsys, args):
    rc, out, err = run_ledger(capsys, "--model", "Llama-3.1-8B", "--gpu", "H100 SXM", *args)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_ledger_through_the_console_script(run_cli, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{")
    result = run_cli("ledger", "--model", bad, "--gpu", "H100 SXM")
    assert result.rc == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"kvdoctor ledger: error: '{bad}' is not JSON (Expecting property name enclosed in double quotes at line 1)"
    ]
    result = run_cli("ledger", "--model", "Llama-3.1-70B", "--gpu", "NVIDIA H100 80GB HBM3", "--json")
    assert result.rc == 1 and json.loads(result.stdout)["suggestion"]["tp"] == 2
