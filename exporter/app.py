"""The exporter's HTTP app: ``/metrics`` plus a small JSON API over the runtime.

``/metrics`` serves the bytes the runtime rendered at the end of its last cycle (it never waits on
a source); the JSON endpoints read the ring store and the sources' status. The responses are
documented in the OpenAPI schema (``/openapi.json``) so the API can be checked against it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

import kvdoctor
from kvdoctor.exporter.exposition import CONTENT_TYPE


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


class StatusOut(BaseModel):
    version: str
    ready: bool
    cycles: int
    interval_seconds: float
    last_cycle_seconds: float
    retained_snapshots: int
    sources: dict[str, SourceOut]


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


def create_app(exporter) -> FastAPI:
    """The FastAPI app serving ``exporter`` (a ``kvdoctor.exporter.runtime.Exporter``)."""
    max_window = int(getattr(exporter.settings, "max_window_seconds", 900))
    app = FastAPI(
        title="kvdoctor exporter",
        version=kvdoctor.__version__,
        description="Canonical LLM-inference signals (Prometheus /metrics), the stored window and the diagnosis.",
    )
    app.state.exporter = exporter
    # Served by the connection itself under serve_in_thread (exporter/fastpath.py); the route below
    # answers the same bytes for other servers and documents /metrics in the OpenAPI schema.
    app.state.prerendered = {"/metrics": (CONTENT_TYPE, exporter.metrics_bytes)}

    @app.get(
        "/metrics",
        response_class=MetricsResponse,
        summary="Prometheus exposition of the last collection cycle",
        responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        return MetricsResponse(exporter.metrics_bytes())

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
            if getattr(exporter, "diagnose_hook", None) is None:
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
            }
        )

    @app.get("/healthz", summary="The process is alive", response_model=Health)
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get(
        "/readyz",
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
