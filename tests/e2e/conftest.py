"""Real-process fixtures for end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.vllm_server import VLLMServer, ensure_tiny_model
from tests.support import tools

# vLLM's start-up (60-120 s; ~230 s seen on a 2-core machine under heavy load) is charged to the
# first test that uses the server: give those tests room beyond the suite's per-test timeout.
VLLM_TEST_TIMEOUT_S = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(VLLM_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """One real vLLM CPU server for the whole session, serving the tiny local model as "tiny"
    with a 16 MiB (~4,000-token) KV cache. Its counters accumulate across tests: compare before/after values.
    Skips when the vLLM venv is missing; errors (with the server's log) when it is there but fails."""
    python = tools.require("vllm")
    model_dir = ensure_tiny_model(python)
    server = VLLMServer(python=python, model_dir=model_dir, workdir=tmp_path_factory.mktemp("vllm"))
    server.start(ready_timeout=360)
    try:
        yield server
    finally:
        server.stop()
