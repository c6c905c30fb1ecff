"""The ledger counts the KV pool as vLLM does: a real vLLM (CPU build) with a fixed KV memory logs
"<device> KV cache size: N tokens" and "Maximum concurrency for L tokens per request: Xx", and
``kvdoctor ledger --kv-cache-memory-bytes`` on the same model folder says the same.

The KV memory (20,000,000 bytes) and the context (1,000 tokens) are chosen so that neither is a
multiple of a 128-token block: the ledger must round blocks and sequences exactly as vLLM does
(38 blocks; 8 blocks per sequence; 4.75x; 4,750 tokens, not 38 x 128 = 4,864).
"""

from __future__ import annotations

import json
import re

import pytest

from kvdoctor import cli
from tests.e2e.vllm_server import VLLMServer, ensure_tiny_model, samples
from tests.support import tools

pytestmark = [pytest.mark.slow, tools.requires_vllm, pytest.mark.timeout(600)]

KV_MEMORY_BYTES = 20_000_000
CONTEXT = 1000
BLOCK_SIZE = 128  # vLLM's block size on CPU
LOG_LINE = re.compile(
    r"(?P<device>\w+) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<context>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x"
)


def test_the_ledgers_token_capacity_is_the_figure_vllm_logs(tmp_path, capsys):
    python = tools.require("vllm")
    model_dir = ensure_tiny_model(python)
    server = VLLMServer(
        python=python,
        model_dir=model_dir,
        workdir=tmp_path,
        kv_cache_bytes=KV_MEMORY_BYTES,
        max_model_len=CONTEXT,
        extra_args=("--block-size", str(BLOCK_SIZE)),
    )
    server.start(ready_timeout=360)
    try:
        info = samples(server.metrics_text(), "vllm:cache_config_info")
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    logged = LOG_LINE.search(log)
    assert logged, f"no KV cache size line in vLLM's log:\n{log[-3000:]}"

    rc = cli.main(
        [
            "ledger",
            "--model", str(model_dir),
            "--gpu-peak-bandwidth", "1e11",  # a CPU: only the capacity matters here
            "--gpu-memory-bytes", "64e9",
            "--kv-cache-memory-bytes", str(KV_MEMORY_BYTES),
            "--block-size", str(BLOCK_SIZE),
            "--context", str(CONTEXT),
            "--batch", "1",
            "--json",
        ]
    )  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["fits"]
    assert int(logged["context"].replace(",", "")) == CONTEXT
    assert result["kv_cache_tokens"] == int(logged["tokens"].replace(",", ""))
    assert f"{result['max_concurrency']:.2f}" == logged["concurrency"]
    assert result["capacity"]["num_blocks"] == 38 and result["kv_cache_tokens"] == 4750  # the arithmetic above
    if info and "num_gpu_blocks" in info[0][0]:
        assert int(info[0][0]["num_gpu_blocks"]) == result["capacity"]["num_blocks"]
