"""Which GPUs the exporter reports: the ``--gpu-filter`` policy.

NVML enumerates every GPU the exporter's container can see. As a Kubernetes sidecar that is
either none of them (it requests no GPU, so the device plugin gives it none) or, with
``NVIDIA_VISIBLE_DEVICES=all``, every GPU of the node. Neither is what the engine next to it
uses. The NVML collector therefore passes the GPUs it sees through a filter built here:

========================  =====================================================================
``--gpu-filter``          keeps
========================  =====================================================================
``auto`` (default)        what CUDA would give this process: ``CUDA_VISIBLE_DEVICES`` when it is
                          set (indices, UUIDs, unique UUID prefixes; CUDA stops at the first
                          entry that names no GPU), else every GPU NVML sees. Right for a bare
                          host, started with the same ``CUDA_VISIBLE_DEVICES`` as the engine.
``all``                   every GPU NVML sees (the container already sees exactly the engine's
                          GPUs, e.g. both containers share one DRA ResourceClaim).
``uuids:GPU-a,GPU-b``     the GPUs with those UUIDs (or unique UUID prefixes).
``file:PATH``             the GPUs listed in PATH, re-read every cycle: UUIDs (or node indices),
                          one per line or comma-separated, or ``all`` / ``none`` / ``void``. The
                          Helm chart's engine writes its own list there from a ``postStart``
                          hook (``nvidia-smi --query-gpu=uuid``) into a shared ``emptyDir``.
``engine-processes``      the GPUs on which another process of this PID namespace runs a
                          compute context (NVML's process list; the pod needs
                          ``shareProcessNamespace: true`` and a driver that reports PIDs in the
                          caller's namespace).
========================  =====================================================================

The policy is pure (``select_*`` functions: GPUs and inputs in, subset out). ``make_gpu_filter``
binds it to its inputs (environment, file, ``/proc``, NVML's process list) and returns the
callable the NVML collector calls on every cycle with its ``[(index, uuid, name), ...]``.
While the input that names the engine's GPUs is not there yet (no file, no engine process on a
GPU) the callable raises ``GpuFilterPending``, a ``SourceError``: the NVML source is reported
down with reason ``gpu_filter_pending`` instead of silently reporting the wrong GPUs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pynvml  # nvidia-ml-py: importing it loads no driver library (nvmlInit does)

from kvdoctor.signals.collection import SourceError

log = logging.getLogger(__name__)

Gpu = tuple[int, str, str]  # (NVML index, UUID, name), as the NVML collector passes them
GpuFilter = Callable[[Sequence[Gpu]], list[Gpu]]

HELP = (
    "which GPUs to report: auto (CUDA_VISIBLE_DEVICES if set, else all), all, "
    "uuids:GPU-a,GPU-b, file:PATH (a list the engine writes), engine-processes "
    "(GPUs running a process of this PID namespace)"
)


class GpuFilterError(ValueError):
    """A ``--gpu-filter`` value or a device list that cannot be understood (one line, without the
    flag's name: the caller says where the value came from)."""


class GpuFilterPending(SourceError):
    """The input naming the engine's GPUs is not available yet; retried on the next cycle."""

    def __init__(self, message: str):
        super().__init__("gpu_filter_pending", message)


@dataclass(frozen=True)
class GpuFilterSpec:
    """A parsed ``--gpu-filter`` value."""

    mode: str
    uuids: tuple[str, ...] = ()
    path: str = ""

    def __str__(self) -> str:
        if self.mode == "uuids":
            return "uuids:" + ",".join(self.uuids)
        if self.mode == "file":
            return "file:" + self.path
        return self.mode


def parse_gpu_filter(text: str) -> GpuFilterSpec:
    """``auto | all | uuids:LIST | file:PATH | engine-processes`` -> GpuFilterSpec.

    Raises GpuFilterError (one line) on anything else.
    """
    value = (text or "").strip()
    mode, sep, arg = value.partition(":")
    mode = mode.strip().lower()
    if mode in ("auto", "all", "engine-processes"):
        if sep:
            raise GpuFilterError(f"{mode} takes no argument, got {text!r}")
        return GpuFilterSpec(mode)
    if mode == "uuids":
        items = tuple(item.strip() for item in arg.split(",") if item.strip())
        if not items:
            raise GpuFilterError("uuids: needs at least one UUID, e.g. uuids:GPU-8f6c...")
        bad = [item for item in items if not _is_uuid_like(item)]
        if bad:
            raise GpuFilterError(f"uuids: {bad[0]!r} is not a GPU UUID (GPU-... or MIG-...)")
        return GpuFilterSpec("uuids", uuids=items)
    if mode == "file":
        path = arg.strip()
        if not path:
            raise GpuFilterError("file: needs a path, e.g. file:/var/run/kvdoctor/engine-gpus")
        return GpuFilterSpec("file", path=path)
    raise GpuFilterError(f"unknown value {text!r} (choose auto, all, uuids:LIST, file:PATH or engine-processes)")


def _is_uuid_like(item: str) -> bool:
    return item.upper().startswith(("GPU-", "MIG-"))


# ------------------------------------------------------------------------------ device lists

ALL = None  # "no restriction" from parse_device_list


def parse_device_list(text: str | None) -> tuple[str, ...] | None:
    """A ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` value -> its entries, or ALL (None).

    ``None`` (unset) and ``all`` mean no restriction; ``""``, ``none`` and ``void`` mean no GPU.
    Entries are split on commas and newlines (a file written by ``nvidia-smi`` has one per line)
    and stripped; ``nvidia-smi`` csv output may quote them.
    """
    if text is None:
        return ALL
    entries = tuple(part.strip().strip('"').strip() for line in text.splitlines() for part in line.split(","))
    entries = tuple(e for e in entries if e)
    lowered = {e.lower() for e in entries}
    if lowered == {"all"}:
        return ALL
    if not entries or lowered <= {"none", "void"}:
        return ()
    if lowered & {"all", "none", "void"}:
        raise GpuFilterError(f"device list {text.strip()!r} mixes all/none/void with devices")
    return entries


def _legacy_mig_parent(entry: str) -> str | None:
    # MIG-GPU-<gpu uuid>/<gi>/<ci> (drivers < 470) names its parent GPU; MIG-<uuid> does not.
    upper = entry.upper()
    if upper.startswith("MIG-GPU-"):
        return entry[4:].split("/", 1)[0]
    return None


def _match(entry: str, gpus: Sequence[Gpu], by_index: bool) -> list[Gpu]:
    """The GPUs one entry names: an index (if ``by_index``), a full UUID or a unique UUID prefix."""
    if entry.isdigit():
        if not by_index:
            return []
        return [g for g in gpus if g[0] == int(entry)]
    uuid = _legacy_mig_parent(entry) or entry
    if not uuid.upper().startswith("GPU-"):
        return []
    exact = [g for g in gpus if g[1].lower() == uuid.lower()]
    if exact:
        return exact
    prefixed = [g for g in gpus if g[1].lower().startswith(uuid.lower())]
    return prefixed if len(prefixed) == 1 else []


def select_devices(
    gpus: Sequence[Gpu],
    entries: tuple[str, ...] | None,
    *,
    cuda_semantics: bool = False,
    by_index: bool = True,
    cuda_device_order: str | None = None,
) -> tuple[list[Gpu], list[str]]:
    """Keep the GPUs ``entries`` name; returns (kept in NVML order, entries that named no GPU).

    ``cuda_semantics``: as CUDA reads ``CUDA_VISIBLE_DEVICES``: the list ends at the first entry
    that names no GPU (``"0,2,-1,1"`` keeps 0 and 2), and indices are CUDA's order, which equals
    NVML's (PCI bus) order only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when all GPUs are the same
    model (CUDA's default FASTEST_FIRST orders mixed models by speed): a GpuFilterError otherwise.
    """
    if entries is ALL:
        return list(gpus), []
    if (
        cuda_semantics
        and by_index
        and any(e.lstrip("-").isdigit() for e in entries)
        and (cuda_device_order or "FASTEST_FIRST").upper() != "PCI_BUS_ID"
        and len({g[2] for g in gpus}) > 1
    ):
        raise GpuFilterError(
            "CUDA_VISIBLE_DEVICES uses indices on a host with mixed GPU models and CUDA_DEVICE_ORDER is "
            "not PCI_BUS_ID, so CUDA's order is unknown here: use GPU UUIDs, or set CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )
    wanted: set[str] = set()
    unmatched: list[str] = []
    for position, entry in enumerate(entries):
        found = _match(entry, gpus, by_index)
        if not found:
            if cuda_semantics:
                unmatched.extend(entries[position:])
                break
            unmatched.append(entry)
            continue
        wanted.update(g[1] for g in found)
    return [g for g in gpus if g[1] in wanted], unmatched


def select_auto(gpus: Sequence[Gpu], environ: Mapping[str, str]) -> list[Gpu]:
    """``auto``: the GPUs CUDA would give a process with this environment."""
    entries = parse_device_list(environ.get("CUDA_VISIBLE_DEVICES"))
    kept, _ = select_devices(gpus, entries, cuda_semantics=True, cuda_device_order=environ.get("CUDA_DEVICE_ORDER"))
    return kept


def select_engine_processes(
    gpus: Sequence[Gpu], processes: Mapping[int, Iterable[int]], engine_pids: Iterable[int]
) -> list[Gpu]:
    """The GPUs whose compute processes (``processes``: NVML index -> PIDs) include an engine PID."""
    engine = set(engine_pids)
    return [g for g in gpus if engine.intersection(processes.get(g[0], ()))]


# --------------------------------------------------------------------------------- inputs


def namespace_pids(proc: str = "/proc", exclude: Iterable[int] = ()) -> set[int]:
    """The PIDs visible in ``proc`` (this PID namespace; with ``shareProcessNamespace`` the pod's),
    without ``exclude`` (the exporter itself)."""
    skip = set(exclude)
    try:
        names = os.listdir(proc)
    except OSError:
        return set()
    return {int(n) for n in names if n.isdigit() and int(n) not in skip}


def nvml_compute_pids(index: int) -> list[int]:
    """PIDs with a compute (or MPS) context on NVML device ``index``; [] if NVML cannot say."""
    pids: list[int] = []
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:
        return pids
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        fn = getattr(pynvml, query, None)
        if fn is None:
            continue
        try:
            pids.extend(int(p.pid) for p in fn(handle))
        except pynvml.NVMLError:
            continue
    return pids


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist (yet)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


# ------------------------------------------------------------------------------- the filter


def make_gpu_filter(
    spec: GpuFilterSpec | str,
    *,
    environ: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] = read_text,
    engine_pids: Callable[[], set[int]] | None = None,
    gpu_pids: Callable[[int], Iterable[int]] = nvml_compute_pids,
) -> GpuFilter:
    """The callable the NVML collector calls each cycle: ``filter(gpus) -> subset``.

    May raise GpuFilterPending (engine's GPU list not known yet) or GpuFilterError (an input
    that names GPUs in a way that cannot be resolved); both are SourceError/ValueError the
    collector reports as the NVML source's error for that cycle.
    """
    if isinstance(spec, str):
        spec = parse_gpu_filter(spec)
    env = os.environ if environ is None else environ
    warned: set[tuple[str, ...]] = set()

    def warn_unmatched(unmatched: list[str], origin: str) -> None:
        key = tuple(unmatched)
        if unmatched and key not in warned:
            warned.add(key)
            log.warning("gpu filter: %s names %s, which match no GPU NVML sees", origin, ", ".join(unmatched))

    if spec.mode == "all":
        return lambda gpus: list(gpus)

    if spec.mode == "auto":

        def auto(gpus: Sequence[Gpu]) -> list[Gpu]:
            try:
                return select_auto(gpus, env)
            except GpuFilterError as exc:
                raise SourceError("gpu_filter_invalid", str(exc)) from None

        return auto

    if spec.mode == "uuids":

        def by_uuid(gpus: Sequence[Gpu]) -> list[Gpu]:
            kept, unmatched = select_devices(gpus, spec.uuids, by_index=False)
            if not kept and gpus:
                raise SourceError(
                    "gpu_not_found",
                    f"--gpu-filter {spec}: no GPU with these UUIDs (NVML sees {', '.join(g[1] for g in gpus)})",
                )
            warn_unmatched(unmatched, f"--gpu-filter {spec}")
            return kept

        return by_uuid

    if spec.mode == "file":

        def from_file(gpus: Sequence[Gpu]) -> list[Gpu]:
            text = read_file(spec.path)
            if text is None:
                raise GpuFilterPending(
                    f"{spec.path} does not exist yet: the engine container writes its GPU list there "
                    "(see the Helm chart's gpuVisibility); or use --gpu-filter engine-processes"
                )
            try:
                entries = parse_device_list(text)
            except GpuFilterError as exc:
                raise SourceError("gpu_filter_invalid", f"{spec.path}: {exc}") from None
            # A list written in the engine's container names node indices (device plugin
            # index strategy) or UUIDs; both are what a sidecar seeing all node GPUs sees.
            kept, unmatched = select_devices(gpus, entries)
            if entries and not kept and gpus:
                raise SourceError(
                    "gpu_not_found",
                    f"{spec.path} names {', '.join(entries)}, but NVML sees only "
                    f"{', '.join(g[1] for g in gpus)}: does the sidecar see the node's GPUs "
                    "(NVIDIA_VISIBLE_DEVICES=all)?",
                )
            warn_unmatched(unmatched, spec.path)
            return kept

        return from_file

    # engine-processes
    own = os.getpid()
    list_pids = engine_pids or (lambda: namespace_pids(exclude=(own,)))

    def by_process(gpus: Sequence[Gpu]) -> list[Gpu]:
        processes = {g[0]: list(gpu_pids(g[0])) for g in gpus}
        pids = list_pids()
        kept = select_engine_processes(gpus, processes, pids)
        if not kept and gpus:
            seen = sorted({p for ps in processes.values() for p in ps} - {own})
            if seen:
                detail = (
                    f"GPUs run PIDs {', '.join(map(str, seen[:8]))}, none of them in this PID namespace: "
                    "is shareProcessNamespace set, and does the driver report namespaced PIDs? "
                    "--gpu-filter file:PATH does not depend on PIDs"
                )
            else:
                detail = "no process runs on any GPU yet (the engine is still starting?)"
            raise GpuFilterPending(f"--gpu-filter engine-processes: {detail}")
        return kept

    return by_process
