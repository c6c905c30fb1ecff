"""schemathesis against the exporter's OpenAPI schema, over real sockets, with real data behind it.

tests/exporter/test_exporter_app.py checks response conformance in-process with five valid
examples per operation and fake collectors. Here the schema is loaded from a live exporter
(uvicorn on a free port) fed by the simulated engine over HTTP and the simulated GPU, with the
rules' diagnosis, and every operation gets valid *and* invalid inputs (schemathesis' negative
mode: wrong types, out-of-range numbers, odd strings). No response may be a 5xx; invalid inputs
must be refused with a 4xx; valid ones must conform to the schema. Bounded: ~2 x 25 examples per
operation, well under a minute.
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from schemathesis import checks
from schemathesis.generation import GenerationMode

from tests.support.demo import InProcessDemo

EXAMPLES = 25
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def live_exporter():
    demo = InProcessDemo("kv_thrashing", interval=0.2, warm_cycles=5, max_window_seconds=120)
    try:
        yield demo.start().exporter_url
    finally:
        demo.stop()


def fuzz(operation, base_url: str, mode: GenerationMode, to_run: list) -> int:
    calls = []

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        calls.append(case)
        case.call_and_validate(base_url=base_url, checks=to_run)

    run()
    return len(calls)


def test_no_server_error_valid_inputs_conform_and_invalid_ones_are_refused(live_exporter):
    schema = schemathesis.openapi.from_url(f"{live_exporter}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/metrics", "/api/v1/window", "/api/v1/diagnosis", "/api/v1/status"}
    positive = [
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
    ]
    negative = [checks.not_a_server_error, checks.negative_data_rejection]
    fuzzed = {}
    for operation in operations:
        fuzzed[(operation.label, "positive")] = fuzz(operation, live_exporter, GenerationMode.POSITIVE, positive)
        if any(True for _ in operation.iter_parameters()):  # nothing to get wrong without parameters
            fuzzed[(operation.label, "negative")] = fuzz(operation, live_exporter, GenerationMode.NEGATIVE, negative)
    assert ("GET /api/v1/window", "negative") in fuzzed
    assert all(n >= 1 for n in fuzzed.values()), fuzzed
