"""The simulated engine's HTTP face: vLLM-format ``/metrics`` on loopback, plus a scenario switch.

The exposition is vLLM 0.32's (``vllm_exposition.py``), so the exporter goes through exactly the
scrape and adapter path it uses against a real vLLM.

Endpoints (all on the engine's port):

=====================  ========================================================================
``GET /metrics``       the exposition (text format 0.0.4)
``GET /health``        200, like vLLM
``GET /v1/models``     the served model, like vLLM's OpenAI server
``GET /scenario``      ``{"scenario", "active", "queue", "summary", "expected_verdict", "choices",
                       "queue_choices"}``
``POST /scenario``     switch the workload now: body ``{"scenario": "kv_thrashing"}`` (or
                       ``?scenario=...``), optionally with the queue behind it, ``"queue":
                       "growing"`` (``none``, ``steady``, ``growing``; scenarios.py; without it
                       the queue stays; alone, it restarts the current scenario with that
                       queue); 200 with the new state, 400 naming the choices
``GET /gpu``           the simulated GPU's cumulative counters (JSON), read by the
                       ``simulated_gpu`` collector the way GPM reads a device
``POST /v1/completions``, ``POST /v1/chat/completions``
                       OpenAI-compatible answers, streamed or not, made by the simulated
                       engine beside the scenario's clients (serving.py): ``kvdoctor stress``
                       runs against the demo
=====================  ========================================================================

``python -m kvdoctor.simulator.engine_server --scenario cycle --port 8000`` runs one
on its own (e.g. for a Prometheus test or to point a separately started exporter at it).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from kvdoctor.signals.records import attributes
from kvdoctor.signals.textformat import CONTENT_TYPE
from kvdoctor.sources.paths import METRICS_PATH

from .gpu import gpu_payload
from .physics import Simulation
from .scenarios import QUEUE_CHOICES, SCENARIO_CHOICES
from .serving import ApiError, CompletionRun, parse_request
from .vllm_exposition import build_registry, render_metrics

MAX_REQUEST_BYTES = 1 << 20  # a request body past this is cut (prompts of a few thousand words fit)


def scenario_payload(sim: Simulation) -> dict:
    active = sim.active_scenario
    return {
        "scenario": sim.scenario,
        "active": active.name,
        "queue": sim.queue,
        **attributes(active, "summary expected_verdict"),
        "choices": list(SCENARIO_CHOICES),
        "queue_choices": list(QUEUE_CHOICES),
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: the demo prints its own status line
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode())

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        sim = self.server.sim
        path = urlsplit(self.path).path
        if path == METRICS_PATH:
            self._send(200, render_metrics(sim, self.server.registry), CONTENT_TYPE)
        elif path in ("/health", "/healthz"):
            self._send(200, b"", "text/plain")
        elif path == "/scenario":
            self._json(200, scenario_payload(sim))
        elif path == "/gpu":
            self._json(200, gpu_payload(sim))
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": sim.config.model_name,
                            "object": "model",
                            "owned_by": "kvdoctor-simulator",
                            "max_model_len": sim.config.max_model_len,
                        }
                    ],
                },
            )
        else:
            self._json(404, {"error": f"no such endpoint {path!r}"})

    def do_POST(self):
        parts = urlsplit(self.path)
        if parts.path in ("/v1/completions", "/v1/chat/completions"):
            self._complete(chat=parts.path.endswith("/chat/completions"))
            return
        if parts.path != "/scenario":
            self._json(404, {"error": f"no such endpoint {parts.path!r}"})
            return
        raw = self._body()
        query = parse_qs(parts.query)
        name = (query.get("scenario") or [None])[0]
        queue = (query.get("queue") or [None])[0]
        if raw and (name is None or queue is None):
            try:
                body = json.loads(raw)
            except ValueError:
                self._json(400, {"error": 'body is not JSON; send {"scenario": NAME}'})
                return
            if isinstance(body, dict):
                name = body.get("scenario") if name is None else name
                queue = body.get("queue") if queue is None else queue
        sim = self.server.sim
        if name is None and queue is not None:
            name = sim.scenario  # only the queue changes: the current scenario restarts with it
        if not isinstance(name, str) or name not in SCENARIO_CHOICES:
            self._json(400, {"error": f"unknown scenario {name!r}", "choices": list(SCENARIO_CHOICES)})
            return
        if queue is not None and queue not in QUEUE_CHOICES:
            self._json(400, {"error": f"unknown queue {queue!r}", "queue_choices": list(QUEUE_CHOICES)})
            return
        sim.set_scenario(name, queue)
        self._json(200, scenario_payload(sim))

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(length, MAX_REQUEST_BYTES)) if length else b""

    def _complete(self, chat: bool) -> None:
        sim = self.server.sim
        try:
            try:
                body = json.loads(self._body() or b"null")
            except ValueError:
                raise ApiError(400, "the request body is not JSON") from None
            completion = parse_request(body, chat, sim.config.model_name, sim.config.max_model_len)
        except ApiError as exc:
            self._json(exc.status, exc.payload())
            return
        run = CompletionRun(sim, completion)
        try:
            if not completion.stream:
                self._json(200, run.answer())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in run.events():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            run.cancel()  # a client that left mid-answer frees its KV blocks; a no-op when done


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # a load generator opens its connections all at once

    def handle_error(self, request, client_address):
        # A scraper that gives up mid-response (its timeout) is not the engine's problem; stay quiet
        # instead of printing socketserver's traceback into the demo's terminal.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, address, sim: Simulation):
        self.sim = sim
        self.registry = build_registry(sim)
        super().__init__(address, _Handler)


class EngineServer:
    """The simulated engine served on ``host:port`` (port 0: a free one) from a daemon thread.

    Binding a port in use raises ``OSError`` (errno EADDRINUSE) from the constructor.
    """

    def __init__(self, sim: Simulation, host: str = "127.0.0.1", port: int = 0):
        self.sim = sim
        self._server = _Server((host, port), sim)
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"kvdoctor-sim-engine-{self.port}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.url + METRICS_PATH

    def start(self) -> EngineServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvdoctor.simulator.engine_server",
        description="Serve the simulated vLLM engine's /metrics on loopback.",
    )
    parser.add_argument("--scenario", default="healthy", choices=SCENARIO_CHOICES)
    parser.add_argument("--queue", default="none", choices=QUEUE_CHOICES, help="the queue behind the scenario")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        sim = Simulation(args.scenario, seed=args.seed, queue=args.queue)
        server = EngineServer(sim, args.host, args.port).start()
    except OSError as exc:
        print(f"simulated engine: cannot bind {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"simulated vLLM engine ({args.scenario}) on {server.metrics_url}", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
