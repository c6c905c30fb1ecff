"""The real-vLLM harness works: the server serves the tiny model and its metrics move under load."""

from __future__ import annotations

import pytest

from tests.e2e.vllm_server import metric_sum, run_load, samples
from tests.support.tools import requires_vllm, wait_until

pytestmark = [pytest.mark.slow, requires_vllm]


def test_real_vllm_reports_kv_usage_and_counts_generated_tokens(vllm_server):
    idle = vllm_server.metrics_text()
    usage = samples(idle, "vllm:kv_cache_usage_perc", model_name="tiny")
    assert usage, "vllm:kv_cache_usage_perc missing from /metrics"
    assert all(0.0 <= value <= 1.0 for _, value in usage)
    before = metric_sum(idle, "vllm:generation_tokens_total", model_name="tiny")
    assert before is not None, "vllm:generation_tokens_total missing from /metrics"

    result = run_load(vllm_server.url, vllm_server.model, concurrency=4, duration_s=8, max_tokens=32)

    assert result.completed >= 1 and not result.errors, result
    assert result.completion_tokens > 0, result

    def counted() -> float | None:
        after = metric_sum(vllm_server.metrics_text(), "vllm:generation_tokens_total", model_name="tiny")
        return after if after >= before + result.completion_tokens else None

    # The counter may trail the last response by one engine step: allow it a moment.
    wait_until(counted, timeout=10, what="generation_tokens_total counting the completed tokens")
