"""The simulated engine's OpenAI-compatible API: what a load generator (kvdoctor stress) needs."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from kvdoctor.cli import main as kvdoctor_main
from kvdoctor.signals.textparse import iter_samples
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.physics import Simulation
from kvdoctor.simulator.requests import API_EPOCH
from kvdoctor.simulator.serving import ApiError, count_tokens, parse_request

MODEL = "m"
STREAM_USAGE = {"include_usage": True, "continuous_usage_stats": True}


def completion(**body):
    return parse_request(body, chat=False, served_model=MODEL, max_model_len=100)


def test_prompt_tokens_are_words_plus_bos():
    assert count_tokens("one two  three\nfour") == 5
    assert completion(prompt="a b c", max_tokens=7).prompt_tokens == 4
    chat = parse_request({"messages": [{"role": "user", "content": "a b"}]}, True, MODEL, 100)
    assert chat.prompt_tokens == 3 + 4 + 1  # words + BOS, the role markers, the assistant's opening
    assert chat.max_tokens == 100 - chat.prompt_tokens  # chat defaults to the rest of the context


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": "a " * 90, "max_tokens": 20}, 400, "maximum context length is 100 tokens"),
        ({"prompt": "a", "model": "other"}, 404, "The model `other` does not exist."),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, 400, "only be defined when `stream=True`"),
        ({"prompt": ["a"]}, 400, "prompt must be a string"),
        ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens must be at least 1"),
    ],
)
def test_requests_vllm_refuses_are_refused_with_its_status(body, status, message):
    with pytest.raises(ApiError, match=message) as caught:
        completion(**body)
    assert caught.value.status == status


@pytest.fixture
def engine():
    with EngineServer(Simulation("healthy", seed=3, warmup=5)) as server:
        yield server


def streamed(engine, body: dict) -> tuple[list[dict], list[float]]:
    chunks, arrivals = [], []
    with (
        httpx.Client(base_url=engine.url, timeout=30) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                chunks.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
                arrivals.append(time.monotonic())
    return chunks, arrivals


def generated_tokens(engine) -> float:
    page = httpx.get(engine.metrics_url).text
    return sum(v for name, _, v, _ in iter_samples(page) if name == "vllm:generation_tokens_total")


def test_a_streamed_completion_comes_token_by_token_as_the_engine_makes_them(engine):
    before = generated_tokens(engine)
    body = {"model": engine.sim.config.model_name, "prompt": "w " * 200, "max_tokens": 40, "stream": True}
    chunks, arrivals = streamed(engine, {**body, "stream_options": STREAM_USAGE})
    assert chunks[-1] == "[DONE]"
    token_chunks = [c for c in chunks[:-1] if c["choices"] and c["choices"][0]["text"]]
    assert len(token_chunks) == 40
    assert [c["usage"]["completion_tokens"] for c in token_chunks] == list(range(1, 41))  # continuous usage
    final = chunks[-2]
    assert final["choices"] == [] and final["usage"] == {
        "prompt_tokens": 201,
        "completion_tokens": 40,
        "total_tokens": 241,
    }
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    # the tokens took the simulated engine's decode time, not one burst
    span = arrivals[len(chunks) - 3] - arrivals[0]
    assert span > 39 * 0.002
    assert generated_tokens(engine) >= before + 40  # it ran in the engine the exporter scrapes


def test_without_usage_options_a_stream_has_no_usage_and_a_plain_answer_has_it(engine):
    chunks, _ = streamed(engine, {"prompt": "a b", "max_tokens": 5, "stream": True})
    assert all("usage" not in c for c in chunks[:-1])
    answer = httpx.post(engine.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 5}, timeout=30).json()
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert answer["choices"][0]["text"].split() == ["token"] * 5
    chat = httpx.post(
        engine.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    ).json()
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 3


def test_a_refused_request_is_an_openai_error_body(engine):
    response = httpx.post(engine.url + "/v1/completions", json={"prompt": "a " * 5000, "max_tokens": 10})
    assert response.status_code == 400
    assert response.json()["object"] == "error" and "maximum context length" in response.json()["message"]


def test_a_client_that_leaves_mid_stream_frees_its_request(engine):
    body = {"prompt": "a " * 100, "max_tokens": 2000, "stream": True}
    with (
        httpx.Client(base_url=engine.url, timeout=30) as client,
        client.stream("POST", "/v1/completions", json=body) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(q.epoch == API_EPOCH for q in (*engine.sim.running, *engine.sim.waiting)):
        time.sleep(0.05)
    assert not any(q.epoch == API_EPOCH for q in (*engine.sim.running, *engine.sim.waiting))


def test_a_scenario_switch_does_not_abort_requests_sent_to_the_api():
    clock = [1_800_000_000.0]
    sim = Simulation("healthy", seed=0, clock=lambda: clock[0], warmup=0)
    req = sim.submit(100, 2000)
    clock[0] += 0.5
    sim.sync()
    sim.set_scenario("kv_thrashing")
    assert req in sim.running or req in sim.waiting
    clock[0] += 120
    sim.sync()
    assert req.done and req not in sim.running and req not in sim.waiting


@pytest.mark.slow
def test_kvdoctor_stress_runs_a_short_plan_against_the_simulated_engine(engine, tmp_path, capsys):
    out = tmp_path / "report"
    rc = kvdoctor_main(
        ["stress", "--engine-url", engine.url, "--prompt-tokens", "1500", "--max-tokens", "200",
         "--start-concurrency", "8", "--max-concurrency", "32", "--step-seconds", "4", "-o", str(out)]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]
    assert [s["concurrency"] for s in steps] == [8, 16, 32]
    assert all(s["requests_failed"] == 0 for s in steps)
    assert steps[-1]["kv_usage_max"] > steps[0]["kv_usage_max"]  # more sequences, more KV
    assert steps[-1]["itl_p50_ms"] > steps[0]["itl_p50_ms"]  # and a slower token: the curve stress draws
