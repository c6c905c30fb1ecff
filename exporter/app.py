"""The exporter's HTTP app: ``/metrics`` plus a small JSON API over the runtime.

``/metrics`` serves the bytes the runtime rendered at the end of its last cycle (it never waits on
a source), as OpenMetrics when the scraper asks for it; the JSON endpoints read the ring store and
the sources' status. The responses are documented in the OpenAPI schema (``/openapi.json``) so the
API can be checked against it. With ``--web.config.file`` every request passes ``web_guard.py``
(basic auth, rate limit, headers); ``serve_in_thread`` adds TLS from ``app.state.web_guard``.
What the app needs of the exporter is ``Served`` (``runtime.Exporter`` is one).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from typing import Any, Protocol

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Receive, Scope, Send

import kvdoctor
from kvdoctor.exporter.collectors.engine import engine_status
from kvdoctor.exporter.exposition import MetricsPages
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.exporter.store import RingStore
from kvdoctor.exporter.web_config import load_web_config
from kvdoctor.exporter.web_guard import GuardMiddleware, WebGuard
from kvdoctor.signals.collection import Collector
from kvdoctor.signals.textformat import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE
from kvdoctor.sources.paths import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH

log = logging.getLogger("kvdoctor.exporter")


class Served(Protocol):
    """What the app serves: the exporter's settings, its pre-rendered page, store and state."""

    @property
    def settings(self) -> ExporterSettings: ...
    @property
    def store(self) -> RingStore: ...
    @property
    def collectors(self) -> list[Collector]: ...
    @property
    def ready(self) -> threading.Event: ...
    @property
    def cycles(self) -> int: ...
    @property
    def last_cycle_seconds(self) -> float: ...
    @property
    def diagnosing(self) -> bool:
        """Whether a diagnosis is made each cycle (else /api/v1/diagnosis says it is not enabled)."""
        ...

    def metrics_bytes(self) -> bytes: ...
    def diagnosis(self) -> dict[str, Any] | None: ...
    def status(self) -> dict[str, dict[str, Any]]: ...
    def context(self) -> dict[str, Any]: ...


class MetricsPage:
    """GET and HEAD /metrics answered from the pre-rendered page, before FastAPI's routing.

    Pure ASGI, behind uvicorn's own HTTP parsing: the page is bytes rendered once per cycle, so the
    answer is two ``send`` calls, where FastAPI's routing, request object and Response cost ~10x
    that per scrape (a tenth of the exporter's CPU budget at one scrape a second). Anything else
    goes on to the app; the web configuration's middleware runs before this one.
    """

    def __init__(self, app: ASGIApp, pages: MetricsPages):
        self.app = app
        self.pages = pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != METRICS_PATH or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        accept = next((value for name, value in scope["headers"] if name == b"accept"), b"")
        content_type, body = self.pages.negotiate(accept)
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})  # HEAD: uvicorn sends none


class MetricsResponse(Response):
    media_type = CONTENT_TYPE


class SourceOut(BaseModel):
    name: str
    applicable: bool | None = Field(description="False: not present here (no GPU, no URL); null: not asked yet.")
    up: bool | None = Field(description="Whether the last collection succeeded (null when not applicable).")
    last_scrape: float | None = Field(description="Unix time of the last collection attempt.")
    last_success: float | None
    duration_seconds: float | None
    series: int = Field(description="Series the last successful collection produced.")
    last_error: str | None
    last_error_reason: str | None
    last_error_at: float | None
    errors: dict[str, int] = Field(description="Errors so far, by reason.")


class SeriesOut(BaseModel):
    name: str
    labels: dict[str, str]
    values: list[float | None] = Field(description="One value per timestamp; null where the series was absent.")


class WindowOut(BaseModel):
    seconds: int
    timestamps: list[float]
    series: list[SeriesOut]
    sources: dict[str, SourceOut]


class ContextOut(BaseModel):
    model_config = {"extra": "allow"}
    slo_seconds: float = Field(description="The ITL SLO (p95, seconds) the exporter diagnoses against.")
    model: dict[str, Any] | None = Field(description="The model's shape (--model), null if unknown.")
    kv_dtype: str | None
    gpu_model: str | None = Field(description="The GPU's name, from the GPU collectors.")
    gpu_peak_bandwidth_bytes_per_second: float | None


class EngineEndpointOut(BaseModel):
    url: str
    up: bool | None
    last_error_reason: str | None


class EngineOut(BaseModel):
    """The engine adapter in use (null until an auto-detected engine has answered once)."""

    url: str | None
    adapter: str | None
    selection: str = Field(description="auto (recognised from the page) or configured (--engine)")
    endpoints: dict[str, EngineEndpointOut] = Field(description="JSON endpoints read next to /metrics")
    cannot_provide: list[str] = Field(description="canonical signals the engine cannot provide now")


class StatusOut(BaseModel):
    version: str
    ready: bool
    cycles: int
    interval_seconds: float
    last_cycle_seconds: float
    retained_snapshots: int
    sources: dict[str, SourceOut]
    engine: EngineOut | None = None
    context: ContextOut | None = Field(description="What the exporter diagnoses with; clients use it.")


class DiagnosisOut(BaseModel):
    model_config = {"extra": "allow"}
    verdict: str


class Detail(BaseModel):
    detail: str


class Health(BaseModel):
    status: str


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_response(payload: Any, status_code: int = 200) -> Response:
    """JSON without pydantic's per-value validation (windows hold 100k+ numbers); inf/NaN -> null."""
    try:
        body = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except ValueError:
        body = json.dumps(_finite(payload), allow_nan=False, separators=(",", ":"))
    return Response(body, status_code=status_code, media_type="application/json")


def create_app(exporter: Served) -> FastAPI:
    """The FastAPI app serving ``exporter`` (a ``kvdoctor.exporter.runtime.Exporter``).

    Raises ``WebConfigError`` (a ValueError, one line) when its settings' ``web_config_file`` cannot be used.
    """
    web_config_file = exporter.settings.web_config_file
    guard = WebGuard(load_web_config(web_config_file)) if web_config_file else None
    max_window = int(exporter.settings.max_window_seconds)
    app = FastAPI(
        title="kvdoctor exporter",
        version=kvdoctor.__version__,
        description="Canonical LLM-inference signals (Prometheus /metrics), the stored window and the diagnosis.",
    )
    app.state.exporter = exporter
    app.state.web_guard = guard
    pages = MetricsPages(exporter.metrics_bytes)
    app.add_middleware(MetricsPage, pages=pages)  # inside the guard: added first
    if guard is not None:
        app.add_middleware(GuardMiddleware, guard=guard)
        log.info("web config %s: %s", web_config_file, guard.config.describe())

    # Answered by MetricsPage before routing; the route documents /metrics in the OpenAPI schema.
    @app.get(
        METRICS_PATH,
        response_class=MetricsResponse,
        summary="Prometheus exposition of the last collection cycle (OpenMetrics when the Accept header asks)",
        responses={
            200: {
                "content": {
                    CONTENT_TYPE: {"schema": {"type": "string"}},
                    OPENMETRICS_CONTENT_TYPE: {"schema": {"type": "string"}},
                }
            }
        },
    )
    async def metrics(request: Request) -> Response:
        content_type, body = pages.negotiate(request.headers.get("accept", "").encode("latin-1"))
        return Response(body, headers={"content-type": content_type.decode()})

    @app.get(
        "/api/v1/window",
        summary="The stored samples of the last N seconds, as columns",
        response_model=None,
        responses={200: {"model": WindowOut}},
    )
    def window(
        seconds: int = Query(60, ge=1, le=max_window, description=f"Seconds back from now, 1..{max_window}."),
    ) -> Response:
        payload = exporter.store.window(seconds).to_json()
        payload["seconds"] = seconds
        payload["sources"] = exporter.status()
        return json_response(payload)

    @app.get(
        "/api/v1/diagnosis",
        summary="The last diagnosis of the last 60 s",
        response_model=None,
        responses={200: {"model": DiagnosisOut}, 503: {"model": Detail, "description": "No diagnosis yet."}},
    )
    def diagnosis() -> Response:
        result = exporter.diagnosis()
        if result is None:
            if not exporter.diagnosing:
                reason = "diagnosis is not enabled in this exporter"
            else:
                reason = "no diagnosis yet: the first collection cycle has not completed"
            return json_response({"detail": reason}, status_code=503)
        return json_response(result)

    @app.get(
        "/api/v1/status",
        summary="Sources: up, last error, last scrape",
        response_model=None,
        responses={200: {"model": StatusOut}},
    )
    def status() -> Response:
        return json_response(
            {
                "version": kvdoctor.__version__,
                "ready": exporter.ready.is_set(),
                "cycles": exporter.cycles,
                "interval_seconds": float(exporter.settings.interval),
                "last_cycle_seconds": float(exporter.last_cycle_seconds),
                "retained_snapshots": len(exporter.store),
                "sources": exporter.status(),
                "engine": engine_status(exporter.collectors),
                "context": exporter.context(),
            }
        )

    @app.get(HEALTHZ_PATH, summary="The process is alive", response_model=Health)
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get(
        READYZ_PATH,
        summary="One collection cycle has completed",
        response_model=None,
        responses={200: {"model": Health}, 503: {"model": Health, "description": "Still starting."}},
    )
    async def readyz() -> Response:
        if exporter.ready.is_set():
            return json_response({"status": "ready"})
        return json_response({"status": "starting"}, status_code=503)

    return app


__all__ = ["create_app"]
