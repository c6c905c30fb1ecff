"""What the exporter adds from the rules every cycle: its published context, the live verdict and
the decode-step floor.

The context it diagnoses with (its SLO, the model's shape, the GPU and its peak bandwidth) is
published every cycle as ``kvdoctor_inter_token_latency_slo_seconds`` and ``kvdoctor_context_info``
(stored with the samples, so its window, Prometheus and traces carry it) and in ``/api/v1/status``,
so every client diagnoses against the same SLO (``PublishedContext``). With a diagnose hook the last
``diagnosis_window`` seconds are diagnosed every cycle, with the thresholds sized for the collection
interval, and ``kvdoctor_diagnosis_verdict{verdict}`` (a state set over every verdict) is added to
the page; a failing hook is counted as an error of the ``diagnosis`` source and costs nothing else.
With the model's shape, ``kvdoctor_decode_step_floor_seconds`` is computed from the cycle's samples.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from kvdoctor.exporter.accounting import SourceAccounting
from kvdoctor.exporter.store import RingStore
from kvdoctor.ledger.arithmetic import decode_step_floor, kv_bytes_per_token, weight_bytes_per_step
from kvdoctor.ledger.gpus import lookup_gpu
from kvdoctor.ledger.model import ModelShape
from kvdoctor.rules import diagnosis
from kvdoctor.rules.context import Context, context_to_json, published_samples
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds, sized_for_interval
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.window import Labels, SeriesKey, Window, labels_of

log = logging.getLogger("kvdoctor.exporter")

# Fewer snapshots than this give no rates (one snapshot has no increase): no verdict yet, rather
# than an "idle" or a low-confidence slow verdict read off a single instant after a restart.
MIN_DIAGNOSIS_SNAPSHOTS = 3
DIAGNOSIS_SOURCE = "diagnosis"  # errors of the diagnose hook are counted under this source


class Diagnosis(Protocol):
    verdict: str

    def to_json(self) -> dict: ...


DiagnoseHook = Callable[[Window], Diagnosis]
SeriesKeyOf = Callable[[str, Labels], SeriesKey]


def known_verdicts() -> tuple[str, ...]:
    """Every verdict id: the verdict gauge is a state set over all of them."""
    return tuple(VERDICTS)


def settings_context(settings: Any, model_shape: ModelShape | None = None) -> Context:
    """The context the settings give: the SLO, the model, the GPU's peak bandwidth."""
    return Context(
        model=model_shape,
        gpu_peak_bandwidth=getattr(settings, "gpu_peak_bandwidth", None),
        slo_seconds=float(getattr(settings, "slo_ms", DEFAULT_SLO_SECONDS * 1e3)) / 1e3,
        slo_source="the exporter's --slo-ms",
        ttft_slo_seconds=ttft_ms / 1e3 if (ttft_ms := getattr(settings, "ttft_slo_ms", None)) else None,
    )


def default_diagnose_hook(settings: Any, model_shape: ModelShape | None = None) -> DiagnoseHook:
    """``rules.diagnosis.diagnose`` with the settings' context, its thresholds sized for the
    collection interval (every range holds 4 collections)."""
    context = settings_context(settings, model_shape)
    thresholds = sized_for_interval(Thresholds(), float(getattr(settings, "interval", 1.0)))

    def diagnose(window: Window) -> diagnosis.Diagnosis:
        return diagnosis.diagnose(window, context=context, thresholds=thresholds)

    return diagnose


class PublishedContext:
    """The exporter's context as it publishes it: the settings', with the GPU's name and peak
    bandwidth filled in from what the GPU collectors report."""

    def __init__(self, settings: Any, model_shape: ModelShape | None = None):
        self.context = settings_context(settings, model_shape)
        self.missing = ""  # what the exporter could not find, with the flag that supplies it

    def update(self, samples: Mapping[SeriesKey, float]) -> None:
        """Take the GPU's name and peak bandwidth from a cycle's samples, where the settings say nothing."""
        gpu, peak = self.context.gpu_model, self.context.gpu_peak_bandwidth
        for (name, labels), value in samples.items():
            if not gpu and name in (S.GPU_DRAM_BANDWIDTH_UTILIZATION, S.GPU_SM_ACTIVE):
                gpu = dict(labels).get("model") or None
            elif name == S.GPU_DRAM_PEAK_BANDWIDTH and value > 0 and not self.context.gpu_peak_bandwidth:
                peak = max(peak or 0.0, value)
        if not peak and gpu:
            spec = lookup_gpu(gpu)
            peak = spec.peak_bandwidth if spec else None
        self.context = replace(self.context, gpu_model=gpu, gpu_peak_bandwidth=peak)

    def series(self, key: SeriesKeyOf) -> list[tuple[SeriesKey, float]]:
        """The SLO gauge and the info metric, for the page and the store."""
        return [(key(name, labels_of(labels)), value) for name, labels, value in published_samples(self.context)]

    def to_json(self) -> dict[str, Any]:
        payload = context_to_json(self.context)
        if self.missing:
            payload["missing"] = self.missing
        return payload


def decode_floor(
    samples: Mapping[SeriesKey, float], shape: ModelShape, peak_override: float | None = None
) -> float | None:
    """(weights read per step + live KV bytes) / peak bandwidth of the GPUs seen; None when a figure
    is missing. A MoE's step reads the experts its running batch touches (``weight_bytes_per_step``).

    Live KV is the fullest engine pool (usage x capacity; with data parallelism each rank has
    its own pool and the slowest sets the pace). The peak is per GPU (the override, else what
    the GPU collectors report) times the number of GPUs seen, i.e. the model is assumed to be
    sharded over the GPUs this exporter sees (tensor parallelism within the pod).
    """
    usage: dict[Labels, float] = {}
    capacity: dict[Labels, float] = {}
    peaks: dict[str, float] = {}
    running = 0.0  # sequences in the batch: a MoE step reads only the experts they touch
    for (name, labels), value in samples.items():
        # vLLM's cache_config_info carries no model_name: join usage and capacity without it.
        pool = tuple(kv for kv in labels if kv[0] != "model_name")
        if name == S.KV_CACHE_USAGE:
            usage[pool] = value
        elif name == S.KV_CACHE_CAPACITY:
            capacity[pool] = value
        elif name == S.GPU_DRAM_PEAK_BANDWIDTH:
            peaks[dict(labels).get("gpu", "")] = value
        elif name == S.REQUESTS_RUNNING:
            running += value
    gpus = max(1, len(peaks))
    per_gpu = peak_override or (max(peaks.values()) if peaks else None)
    if not per_gpu:
        return None
    try:
        per_token = kv_bytes_per_token(shape)
        live = max((u * capacity[lb] * per_token for lb, u in usage.items() if lb in capacity), default=0.0)
        weights = weight_bytes_per_step(shape, max(1, round(running)))
        return decode_step_floor(weights, live, per_gpu * gpus)
    except ValueError as exc:
        log.debug("no decode-step floor: %s", exc)
        return None


class LiveDiagnosis:
    """Runs the hook over the store's last ``window_seconds`` and keeps the latest result."""

    def __init__(self, hook: DiagnoseHook, window_seconds: float):
        self.hook = hook
        self.window_seconds = window_seconds
        self.verdicts = known_verdicts()
        self.latest: dict | None = None

    def page_series(
        self, store: RingStore, ts: float, accounting: SourceAccounting, key: SeriesKeyOf
    ) -> list[tuple[SeriesKey, float]]:
        """The verdict state set for the page; the diagnosis error counter if the hook failed."""
        window = store.window(self.window_seconds)
        if len(window) < MIN_DIAGNOSIS_SNAPSHOTS:
            return []
        try:
            result = self.hook(window)
            payload = result.to_json()
            verdict = str(result.verdict)
        except Exception as exc:  # the diagnosis is an extra; its failure must not cost the page
            count = accounting.count_error(DIAGNOSIS_SOURCE, "exception")
            log.warning("diagnosis failed: %s: %s", type(exc).__name__, exc)
            return [(key(S.SOURCE_ERRORS, (("reason", "exception"), ("source", DIAGNOSIS_SOURCE))), float(count))]
        self.latest = {**payload, "ts": ts} if isinstance(payload, dict) else payload
        return [(key(S.DIAGNOSIS_VERDICT, (("verdict", v),)), 1.0 if v == verdict else 0.0) for v in self.verdicts]
