"""Pure arithmetic from a ``Window`` to what the charts show: rates, latency quantiles, targets.

No I/O and no Dash here. Counters are turned into per-point increases over a trailing window
(``rate_window`` seconds, like PromQL's ``increase(x[10s])``) with counter resets handled, and the
per-token latency quantiles come from the windowed increase of the ``_bucket`` series, with the
same interpolation as PromQL's ``histogram_quantile`` (the rules' ``stats.histogram_quantile_rows``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

import numpy as np

from kvdoctor.rules.verdicts import CATALOGUE, rank
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.stats import counter_rate, histogram_quantile_rows, windowed_increase
from kvdoctor.signals.window import Labels, Window

# Label filters a target may carry; anything else in a target string is ignored.
ENGINE_TARGET_LABELS = ("pod", "engine", "model_name", "dp_rank")
GPU_TARGET_LABELS = ("pod", "gpu")
TARGET_LABELS = ("pod", "engine", "model_name", "dp_rank", "gpu")


def severity(verdict: str | None) -> int:
    """Higher is worse: the catalogue's rank turned around (rules/verdicts.py holds the one order)."""
    return len(CATALOGUE) - rank(verdict)


# --------------------------------------------------------------------------------------- targets


def parse_target(value: str | None) -> dict[str, str]:
    """``"engine=vllm&dp_rank=0"`` -> ``{"engine": "vllm", "dp_rank": "0"}`` (known labels only)."""
    if not value:
        return {}
    return {k: v for k, v in parse_qsl(value, keep_blank_values=False) if k in TARGET_LABELS}


def format_target(labels: Mapping[str, str]) -> str:
    return urlencode([(k, labels[k]) for k in TARGET_LABELS if labels.get(k)])


def engine_filter(target: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in target.items() if k in ENGINE_TARGET_LABELS}


def gpu_filter(target: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in target.items() if k in GPU_TARGET_LABELS}


@dataclass(frozen=True)
class TargetOption:
    label: str
    value: str


def target_options(series: Iterable[tuple[str, Labels | Mapping[str, str]]]) -> list[TargetOption]:
    """What the target picker offers for these series (``window.series.keys()``): everything, then
    each pod, engine and GPU."""
    pods: set[str] = set()
    engines: set[tuple[tuple[str, str], ...]] = set()
    gpus: dict[str, str] = {}
    for name, labels in series:
        d = dict(labels)
        if d.get("pod"):
            pods.add(d["pod"])
        if name == S.KV_CACHE_USAGE or name == S.GENERATION_TOKENS or name == S.INTER_TOKEN_LATENCY + "_count":
            engines.add(tuple((k, d[k]) for k in ENGINE_TARGET_LABELS if d.get(k)))
        elif name in (S.GPU_DRAM_BANDWIDTH_UTILIZATION, S.GPU_SM_ACTIVE, S.GPU_MEMORY_USED) and "gpu" in d:
            gpus[d["gpu"]] = d.get("model", "")
    options = [TargetOption("All engines and GPUs", "")]
    if len(pods) > 1:
        options += [TargetOption(f"pod {p}", format_target({"pod": p})) for p in sorted(pods)]
    if len(engines) > 1:
        for eng in sorted(engines):
            d = dict(eng)
            text = " · ".join(
                [f"engine {d.get('engine', '?')}"]
                + ([d["model_name"]] if d.get("model_name") else [])
                + ([f"dp {d['dp_rank']}"] if d.get("dp_rank") else [])
                + ([f"pod {d['pod']}"] if d.get("pod") and len(pods) > 1 else [])
            )
            options.append(TargetOption(text, format_target(d)))
    for gpu in sorted(gpus, key=natural_key):
        model = f" · {gpus[gpu]}" if gpus[gpu] else ""
        options.append(TargetOption(f"GPU {gpu}{model}", format_target({"gpu": gpu})))
    return options


def natural_key(text: str):
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


# ------------------------------------------------------------------------------------ arithmetic


def nansum_rows(arrays: list[np.ndarray], n: int) -> np.ndarray:
    """Element-wise sum ignoring NaN; NaN where every input is NaN (or there are none)."""
    if not arrays:
        return np.full(n, np.nan)
    stacked = np.vstack(arrays)
    total = np.nansum(stacked, axis=0)
    total[np.all(np.isnan(stacked), axis=0)] = np.nan
    return total


def nanmax_rows(arrays: list[np.ndarray], n: int) -> np.ndarray:
    if not arrays:
        return np.full(n, np.nan)
    stacked = np.vstack(arrays)
    out = np.full(n, np.nan)
    some = ~np.all(np.isnan(stacked), axis=0)
    out[some] = np.nanmax(stacked[:, some], axis=0)
    return out


def summed_rate(window: Window, name: str, rate_window: float, **label_filter: str) -> np.ndarray:
    """Sum over matching series of each series' rate (rate before sum, as PromQL wants)."""
    return nansum_rows(
        [counter_rate(window.timestamps, v, rate_window) for v in window.select(name, **label_filter).values()],
        len(window),
    )


def _le(labels: Labels) -> float | None:
    for k, v in labels:
        if k == "le":
            try:
                return math.inf if v in ("+Inf", "Inf", "inf") else float(v)
            except ValueError:
                return None
    return None


def bucket_increases(window: Window, histogram: str, rate_window: float, **label_filter: str):
    """(upper bounds sorted, (n, buckets) increases summed over the other labels)."""
    per_le: dict[float, list[np.ndarray]] = {}
    for labels, values in window.select(histogram + "_bucket", **label_filter).items():
        le = _le(labels)
        if le is None:
            continue
        inc, _ = windowed_increase(window.timestamps, values, rate_window)
        per_le.setdefault(le, []).append(inc)
    bounds = np.array(sorted(per_le), dtype=float)
    n = len(window)
    if len(bounds) == 0:
        return bounds, np.empty((n, 0))
    counts = np.column_stack([nansum_rows(per_le[b], n) for b in bounds])
    return bounds, counts


def histogram_mean(window: Window, histogram: str, rate_window: float, **label_filter: str) -> np.ndarray:
    """Mean observation over the trailing window: increase(_sum) / increase(_count)."""
    n = len(window)
    sums = [
        windowed_increase(window.timestamps, v, rate_window)[0]
        for v in window.select(histogram + "_sum", **label_filter).values()
    ]
    cnts = [
        windowed_increase(window.timestamps, v, rate_window)[0]
        for v in window.select(histogram + "_count", **label_filter).values()
    ]
    s, c = nansum_rows(sums, n), nansum_rows(cnts, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c > 0, s / c, np.nan)


# ----------------------------------------------------------------------------------- live frame


@dataclass
class GpuSeries:
    gpu: str
    model: str
    dram_method: str
    sm_method: str
    dram: np.ndarray  # 0..1
    sm: np.ndarray  # 0..1


@dataclass
class LiveFrame:
    """Everything the Live charts plot, as arrays aligned on ``ts`` (Unix seconds)."""

    ts: np.ndarray
    kv_usage: np.ndarray  # 0..1, max over the selected engines
    itl_p50: np.ndarray  # seconds
    itl_p95: np.ndarray
    itl_mean: np.ndarray
    resident_tokens: np.ndarray  # usage x capacity summed over engines; NaN when capacity unknown
    kv_capacity_tokens: float  # NaN when unknown
    preemption_rate: np.ndarray
    kv_to_gpu_rate: np.ndarray  # bytes/s
    kv_from_gpu_rate: np.ndarray
    pcie_rx: np.ndarray  # bytes/s summed over the selected GPUs
    pcie_tx: np.ndarray
    decode_floor: np.ndarray  # seconds, NaN when the model shape is unknown
    gpus: list[GpuSeries] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ts)


def slice_frame(frame: LiveFrame, mask: np.ndarray) -> LiveFrame:
    """The points of ``frame`` where ``mask`` is true (constants and GPU identities kept)."""
    fields = {
        name: getattr(frame, name)[mask]
        for name in (
            "ts",
            "kv_usage",
            "itl_p50",
            "itl_p95",
            "itl_mean",
            "resident_tokens",
            "preemption_rate",
            "kv_to_gpu_rate",
            "kv_from_gpu_rate",
            "pcie_rx",
            "pcie_tx",
            "decode_floor",
        )
    }
    gpus = [GpuSeries(g.gpu, g.model, g.dram_method, g.sm_method, g.dram[mask], g.sm[mask]) for g in frame.gpus]
    return LiveFrame(kv_capacity_tokens=frame.kv_capacity_tokens, gpus=gpus, **fields)


def _latest(values: np.ndarray) -> float:
    valid = values[~np.isnan(values)]
    return float(valid[-1]) if len(valid) else math.nan


def live_frame(window: Window, target: Mapping[str, str] | None = None, rate_window: float = 10.0) -> LiveFrame:
    """The Live page's arrays for ``target`` (label filters, see ``parse_target``)."""
    target = dict(target or {})
    ef, gf = engine_filter(target), gpu_filter(target)
    n, ts = len(window), window.timestamps

    usage = window.select(S.KV_CACHE_USAGE, **ef)
    # The capacity comes from the engine's config, which may carry fewer labels than the usage
    # (vLLM's cache_config_info has no model_name): match on the labels it has.
    capacity = window.select(S.KV_CACHE_CAPACITY, **{k: v for k, v in ef.items() if k != "model_name"})
    resident_parts, total_capacity = [], 0.0
    for labels, u in usage.items():
        cap = capacity.get(labels)
        if cap is None:
            cap = next((c for cl, c in capacity.items() if set(cl) <= set(labels)), None)
        if cap is not None and not math.isnan(_latest(cap)):
            resident_parts.append(u * cap)
            total_capacity += _latest(cap)
    resident = (
        nansum_rows(resident_parts, n) if resident_parts and len(resident_parts) == len(usage) else np.full(n, np.nan)
    )

    bounds, counts = bucket_increases(window, S.INTER_TOKEN_LATENCY, rate_window, **ef)
    transfers = {"to_gpu": [], "from_gpu": []}
    for labels, values in window.select(S.KV_TRANSFER_BYTES, **ef).items():
        direction = dict(labels).get("direction")
        if direction in transfers:
            transfers[direction].append(counter_rate(ts, values, rate_window))

    floor_filter = {"pod": target["pod"]} if "pod" in target else {}
    floors = list(window.select(S.DECODE_STEP_FLOOR, **floor_filter).values())

    gpus = []
    dram = window.select(S.GPU_DRAM_BANDWIDTH_UTILIZATION, **gf)
    sm = window.select(S.GPU_SM_ACTIVE, **gf)
    by_gpu: dict[tuple[str, str], dict] = {}
    for kind, group in (("dram", dram), ("sm", sm)):
        for labels, values in group.items():
            d = dict(labels)
            slot = by_gpu.setdefault((d.get("pod", ""), d.get("gpu", "?")), {"model": d.get("model", "")})
            slot[kind] = values
            slot[kind + "_method"] = d.get("method", "")
    for (pod, gpu), slot in sorted(by_gpu.items(), key=lambda kv: (kv[0][0], natural_key(kv[0][1]))):
        name = gpu if not pod or len({p for p, _ in by_gpu}) == 1 else f"{pod}/{gpu}"
        gpus.append(
            GpuSeries(
                gpu=name,
                model=slot["model"],
                dram_method=slot.get("dram_method", ""),
                sm_method=slot.get("sm_method", ""),
                dram=slot.get("dram", np.full(n, np.nan)),
                sm=slot.get("sm", np.full(n, np.nan)),
            )
        )

    return LiveFrame(
        ts=ts,
        kv_usage=nanmax_rows(list(usage.values()), n),
        itl_p50=histogram_quantile_rows(0.50, bounds, counts),
        itl_p95=histogram_quantile_rows(0.95, bounds, counts),
        itl_mean=histogram_mean(window, S.INTER_TOKEN_LATENCY, rate_window, **ef),
        resident_tokens=resident,
        kv_capacity_tokens=total_capacity if total_capacity > 0 else math.nan,
        preemption_rate=summed_rate(window, S.PREEMPTIONS, rate_window, **ef),
        kv_to_gpu_rate=nansum_rows(transfers["to_gpu"], n),
        kv_from_gpu_rate=nansum_rows(transfers["from_gpu"], n),
        pcie_rx=nansum_rows(list(window.select(S.GPU_PCIE_RX, **gf).values()), n),
        pcie_tx=nansum_rows(list(window.select(S.GPU_PCIE_TX, **gf).values()), n),
        decode_floor=nanmax_rows(floors, n),
        gpus=gpus,
    )


# ------------------------------------------------------------------------------- source health


@dataclass(frozen=True)
class SourceHealth:
    name: str
    up: bool
    error: str = ""


def source_health(window: Window, status: Mapping | None = None) -> list[SourceHealth]:
    """Each source's last ``kvdoctor_source_up`` value, with the exporter's last error when known."""
    errors = {}
    for name, info in ((status or {}).get("sources") or {}).items():
        if isinstance(info, Mapping):
            errors[str(name)] = str(info.get("last_error") or "")
    out = {}
    for labels, values in window.select(S.SOURCE_UP).items():
        name = dict(labels).get("source", "?")
        last = _latest(values)
        if not math.isnan(last):
            out[name] = SourceHealth(name, last >= 1.0, errors.get(name, ""))
    for name, info in ((status or {}).get("sources") or {}).items():
        if name not in out and isinstance(info, Mapping) and "up" in info:
            out[name] = SourceHealth(str(name), bool(info["up"]), errors.get(str(name), ""))
    return [out[k] for k in sorted(out)]
