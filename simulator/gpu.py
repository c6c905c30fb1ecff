"""The simulated GPU collector: the NVML collector's signals, read from the built-in simulator.

It plays the part NVML GPM plays on a Hopper GPU: the device keeps cumulative activity counters
(DRAM bytes, SM-busy time, PCIe bytes), the collector reads them twice and turns the difference
into ``DRAM_BW_UTIL``, ``SM_UTIL`` and ``PCIE_RX/TX_PER_SEC``-style values, labelled
``method="gpm"``. So, like GPM, the first collection has no ratios yet (it needs two samples).

A deployment split over several GPUs (``EngineConfig.tensor_parallel``, ``kvdoctor demo --gpus``)
reports each GPU with its own index, UUID, memory and counters: the ranks share each step, rank 0
also samples, and the others wait on it at each all-reduce, so each rank past the first does a
little less DRAM and SM work (``RANK_SPREAD`` per rank).

Each GPU also reports the health signals NVML gives (temperature, power against the limit, clocks
against their maximum, throttle reasons, XID and ECC errors, remapped rows, the PCIe link), with the
values of a healthy GPU (``GpuHealth``): clocks at their maximum, no throttle reason, no error, the
link at its maximum; power and temperature follow the GPU's activity.

Sources: an in-process ``Simulation`` (tests, benchmarks), or the simulated engine's ``GET /gpu``
over HTTP (what ``kvdoctor demo`` uses: ``for_engine_url`` points at the simulated engine the
engine collector scrapes). The exporter does not know this collector: ``kvdoctor demo`` plugs it
in instead of ``nvml`` (``build_exporter(extra_collectors=...)``).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, fields
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected, NotApplicable, SourceError
from kvdoctor.signals.window import labels_of

from .physics import Simulation

NAME = "simulated_gpu"
RANK_SPREAD = 0.01  # each rank past the first: this share less DRAM traffic and SM activity


@dataclass(frozen=True)
class GpuHealth:
    """The health readings of a healthy simulated GPU (H100 SXM-like): fixed but for power and heat."""

    power_limit_watts: float = 700.0
    idle_power_watts: float = 90.0
    idle_temperature_celsius: float = 34.0
    busy_temperature_celsius: float = 68.0  # at full activity, well under the slowdown threshold
    max_sm_clock_mhz: float = 1980.0
    max_memory_clock_mhz: float = 2619.0
    throttle_mask: int = 0  # no clock throttle reason active
    pcie_generation: int = 5
    pcie_width: int = 16

    @classmethod
    def from_payload(cls, p: object) -> GpuHealth:
        if not isinstance(p, dict):
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: type(getattr(cls(), k))(v) for k, v in p.items() if k in known})

    def power_watts(self, activity: float) -> float:
        """Board power at an activity of 0..1 (the busier of DRAM and SMs): idle to 85 % of the limit."""
        return self.idle_power_watts + (0.85 * self.power_limit_watts - self.idle_power_watts) * activity

    def temperature_celsius(self, activity: float) -> float:
        return (
            self.idle_temperature_celsius + (self.busy_temperature_celsius - self.idle_temperature_celsius) * activity
        )


@dataclass(frozen=True)
class GpuSample:
    """One reading of the simulated device."""

    name: str
    memory_total_bytes: float
    memory_used_bytes: float
    peak_bandwidth: float
    seed: int
    time: float
    dram_bytes: float
    sm_active_seconds: float
    pcie_rx_bytes: float
    pcie_tx_bytes: float
    uuid: str = ""
    health: GpuHealth = GpuHealth()

    @classmethod
    def from_payload(cls, p: dict) -> GpuSample:
        try:
            return cls(
                name=str(p["name"]),
                memory_total_bytes=float(p["memory_total_bytes"]),
                memory_used_bytes=float(p["memory_used_bytes"]),
                peak_bandwidth=float(p["peak_bandwidth_bytes_per_second"]),
                seed=int(p.get("seed", 0)),
                time=float(p["time"]),
                dram_bytes=float(p["dram_bytes"]),
                sm_active_seconds=float(p["sm_active_seconds"]),
                pcie_rx_bytes=float(p["pcie_rx_bytes"]),
                pcie_tx_bytes=float(p["pcie_tx_bytes"]),
                uuid=str(p.get("uuid", "")),
                health=GpuHealth.from_payload(p.get("health")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceError("bad_payload", f"simulated GPU payload lacks or mangles {exc}") from None

    @classmethod
    def all_from_payload(cls, p: dict) -> list[GpuSample]:
        """Every GPU of a payload: its ``gpus`` list (one entry each), else the one it describes."""
        if not isinstance(p.get("gpus"), list) or not p["gpus"]:
            return [cls.from_payload(p)]
        return [cls.from_payload({**p, **gpu}) for gpu in p["gpus"] if isinstance(gpu, dict)]


class GpuSource(Protocol):
    def read(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


def gpu_payload(sim: Simulation) -> dict:
    """What the simulated engine's ``GET /gpu`` returns: the GPU's identity and cumulative
    counters, good to ``time``, and under ``gpus`` each GPU of a tensor-parallel deployment with
    its own UUID and counters (``GpuSample.all_from_payload`` reads them back)."""
    sim.sync()
    reading = sim.gpu_reading()
    cfg = sim.config
    gpus = []
    for rank in range(cfg.tensor_parallel):
        work = 1.0 - RANK_SPREAD * rank
        gpus.append(
            {
                "index": rank,
                "uuid": gpu_uuid(sim.seed, rank),
                "dram_bytes": reading.dram_bytes * work,
                "sm_active_seconds": reading.sm_active_seconds * work,
                "pcie_rx_bytes": reading.pcie_rx_bytes,
                "pcie_tx_bytes": reading.pcie_tx_bytes,
            }
        )
    health = GpuHealth(
        max_memory_clock_mhz=float(cfg.gpu.max_memory_clock_mhz or GpuHealth.max_memory_clock_mhz),
        pcie_generation=cfg.gpu.pcie_generation or GpuHealth.pcie_generation,
    )
    return {
        "name": cfg.gpu_name,
        "health": asdict(health),
        "memory_total_bytes": cfg.gpu.memory_bytes,
        "memory_used_bytes": cfg.memory_used_bytes,
        "peak_bandwidth_bytes_per_second": cfg.gpu.peak_bandwidth,
        "seed": sim.seed,
        "time": reading.time,
        "dram_bytes": reading.dram_bytes,
        "sm_active_seconds": reading.sm_active_seconds,
        "pcie_rx_bytes": reading.pcie_rx_bytes,
        "pcie_tx_bytes": reading.pcie_tx_bytes,
        "gpus": gpus,
    }


class SimulationSource:
    """Reads an in-process Simulation."""

    def __init__(self, sim: Simulation):
        self.sim = sim

    def read(self) -> list[GpuSample]:
        return GpuSample.all_from_payload(gpu_payload(self.sim))

    def close(self) -> None:
        pass


class HttpSource:
    """Reads the simulated engine's ``GET /gpu``."""

    def __init__(self, url: str, timeout: float = 2.0):
        self.url = url
        self._client = httpx.Client(timeout=timeout)

    @classmethod
    def for_engine(cls, engine_url: str, timeout: float = 2.0) -> HttpSource:
        """The ``/gpu`` endpoint next to an engine's ``/metrics`` URL."""
        parts = urlsplit(engine_url)
        return cls(urlunsplit((parts.scheme, parts.netloc, "/gpu", "", "")), timeout)

    def read(self) -> list[GpuSample]:
        try:
            resp = self._client.get(self.url)
        except httpx.ConnectError as exc:
            raise SourceError("connection_refused", f"{self.url}: {exc}") from None
        except httpx.TimeoutException:
            raise SourceError("timeout", f"{self.url}: no answer") from None
        except httpx.HTTPError as exc:
            raise SourceError("http_error", f"{self.url}: {exc}") from None
        if resp.status_code == 404:
            raise NotApplicable(f"{self.url} is not a kvdoctor simulated engine")
        if resp.status_code != 200:
            raise SourceError(f"http_{resp.status_code}", f"{self.url} answered {resp.status_code}")
        try:
            payload = resp.json()
        except ValueError:
            raise SourceError("bad_payload", f"{self.url} did not answer JSON") from None
        if not isinstance(payload, dict):
            raise SourceError("bad_payload", f"{self.url} did not answer a JSON object")
        return GpuSample.all_from_payload(payload)

    def close(self) -> None:
        self._client.close()


def gpu_uuid(seed: int, index: int) -> str:
    """A stable NVML-style UUID for simulated GPU ``index``."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"kvdoctor-simulated-gpu/{seed}/{index}"))


Ratios = tuple[float, float, float, float]  # DRAM bandwidth, SM activity, PCIe rx and tx bytes/s


def _ratios(sample: GpuSample, previous: GpuSample) -> Ratios | None:
    elapsed = sample.time - previous.time
    if not elapsed > 0:
        return None
    return (
        min(1.0, max(0.0, (sample.dram_bytes - previous.dram_bytes) / (elapsed * sample.peak_bandwidth))),
        min(1.0, max(0.0, (sample.sm_active_seconds - previous.sm_active_seconds) / elapsed)),
        max(0.0, (sample.pcie_rx_bytes - previous.pcie_rx_bytes) / elapsed),
        max(0.0, (sample.pcie_tx_bytes - previous.pcie_tx_bytes) / elapsed),
    )


class SimulatedGpuCollector:
    """The simulated engine's GPUs, each with its own index, UUID, memory and counters: every GPU
    the source reports (a tensor-parallel deployment reports one per rank), or ``count`` copies of
    a source that reports one (shards carrying the same load)."""

    name = NAME

    def __init__(self, source: GpuSource | None, count: int | None = None):
        if count is not None and count < 1:
            raise ValueError("count must be at least 1")
        self.source = source
        self.count = count
        self._previous: list[GpuSample] = []
        self._ratios: dict[int, Ratios] = {}

    @classmethod
    def for_simulation(cls, sim: Simulation, count: int | None = None) -> SimulatedGpuCollector:
        return cls(SimulationSource(sim), count)

    def collect(self) -> Collected:
        if self.source is None:
            raise NotApplicable("no simulated engine configured (--engine-url)")
        samples = self.source.read()
        mirrored = len(samples) == 1 and bool(self.count)
        if mirrored and self.count:
            samples = samples * self.count
        previous, self._previous = self._previous, samples
        for index, (sample, before) in enumerate(zip(samples, previous, strict=False)):
            ratios = _ratios(sample, before)
            if ratios is not None:
                self._ratios[index] = ratios
        out = Collected()
        for index, sample in enumerate(samples):
            uuid_ = sample.uuid if sample.uuid and not mirrored else gpu_uuid(sample.seed, index)
            ident = {"gpu": str(index), "uuid": uuid_, "model": sample.name}
            labels = labels_of(ident)
            out.add(S.GPU_MEMORY_TOTAL, sample.memory_total_bytes, labels)
            out.add(S.GPU_MEMORY_USED, sample.memory_used_bytes, labels)
            out.add(S.GPU_DRAM_PEAK_BANDWIDTH, sample.peak_bandwidth, labels)
            ratios = self._ratios.get(index)
            _add_health(out, ident, sample.health, max(ratios[0], ratios[1]) if ratios else 0.0)
            if index in self._ratios:
                dram, sm, rx, tx = self._ratios[index]
                gpm = labels_of(ident, method=S.METHOD_GPM)
                out.add(S.GPU_DRAM_BANDWIDTH_UTILIZATION, dram, gpm)
                out.add(S.GPU_SM_ACTIVE, sm, gpm)
                out.add(S.GPU_PCIE_RX, rx, labels)
                out.add(S.GPU_PCIE_TX, tx, labels)
        return out

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


def _add_health(out: Collected, ident: dict[str, str], health: GpuHealth, activity: float) -> None:
    """The health signals of a healthy GPU: what the NVML collector reads from a real one."""
    labels = labels_of(ident)
    for clock, mhz in ((S.CLOCK_SM, health.max_sm_clock_mhz), (S.CLOCK_MEMORY, health.max_memory_clock_mhz)):
        out.add(S.GPU_CLOCK, mhz * 1e6, labels_of(ident, clock=clock))
        out.add(S.GPU_MAX_CLOCK, mhz * 1e6, labels_of(ident, clock=clock))
    for reason, state in S.throttle_reason_states(health.throttle_mask).items():
        out.add(S.GPU_CLOCK_THROTTLE_REASON, state, labels_of(ident, reason=reason))
    out.add(S.GPU_TEMPERATURE, health.temperature_celsius(activity), labels)
    out.add(S.GPU_POWER_DRAW, health.power_watts(activity), labels)
    out.add(S.GPU_POWER_LIMIT, health.power_limit_watts, labels)
    out.add(S.GPU_XID_ERRORS, 0.0, labels)
    out.add(S.GPU_LAST_XID, 0.0, labels)
    for error in (S.ERROR_CORRECTED, S.ERROR_UNCORRECTED):
        out.add(S.GPU_REMAPPED_ROWS, 0.0, labels_of(ident, error=error))
        for scope in (S.SCOPE_VOLATILE, S.SCOPE_AGGREGATE):
            out.add(S.GPU_ECC_ERRORS, 0.0, labels_of(ident, error=error, scope=scope))
    out.add(S.GPU_ROW_REMAP_PENDING, 0.0, labels)
    out.add(S.GPU_ROW_REMAP_FAILURE, 0.0, labels)
    out.add(S.GPU_PCIE_LINK_GENERATION, float(health.pcie_generation), labels)
    out.add(S.GPU_PCIE_LINK_MAX_GENERATION, float(health.pcie_generation), labels)
    out.add(S.GPU_PCIE_LINK_WIDTH, float(health.pcie_width), labels)
    out.add(S.GPU_PCIE_LINK_MAX_WIDTH, float(health.pcie_width), labels)
    out.add(S.GPU_PCIE_REPLAYS, 0.0, labels)


def for_engine_url(url: str | None, timeout: float = 2.0) -> SimulatedGpuCollector:
    """The collector the demo plugs into the exporter: it reads the simulated engine at ``url``
    (the one the engine collector scrapes); without a URL it is not applicable."""
    return SimulatedGpuCollector(HttpSource.for_engine(url, timeout) if url else None)
