"""The GPU catalogue: one row per GPU, keyed by the exact device name NVML reports.

Each row carries what the ledger needs: memory, peak DRAM bandwidth, the PCIe generation (the host
link for KV offload) and, where published, the memory bus width and the maximum memory clock
NVML reports, from which ``nvml_peak_bandwidth`` recomputes the peak. A name the catalogue does not
know is an error naming the closest known ones (``gpu_spec``), never a guess.

Conventions:
- ``memory_bytes``: the datasheet's capacity, read as GiB (HBM and GDDR come in powers of two); CUDA
  reports about 1% less (driver reservation), and GDDR cards with ECC on about 6% less.
- ``peak_bandwidth``: the datasheet's figure, decimal (1 GB/s = 1e9 bytes/s).
- ``bus_width_bits`` / ``max_memory_clock_mhz``: what NVML (``nvmlDeviceGetMemoryBusWidth``,
  ``nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)``) and CUDA's deviceQuery report on that GPU.
- PCIe bandwidth per direction of an x16 link: Gen3 15.75, Gen4 31.5, Gen5 63 GB/s.
- ``peak_flops``: dense BF16 tensor FLOP/s (no sparsity); FP16 on GPUs without BF16.

Sources (vendor datasheets; the device names from NVIDIA's driver README list of supported GPUs,
github.com/NVIDIA/open-gpu-kernel-modules, and from nvidia-smi / deviceQuery output on the GPUs):
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

from kvdoctor.signals.units import GB, GIB

TFLOPS = 1e12
PCIE_X16_BANDWIDTH = {3: 15.75 * GB, 4: 31.5 * GB, 5: 63 * GB}  # bytes/s per direction
DATA_RATE = 2  # memory transfers per clock NVML reports (double data rate), for HBM and GDDR alike

SOURCES = {
    "h100": "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/",
    "h200": "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/",
    "h20": "NVIDIA H20 product brief (China market), https://www.nvidia.cn/data-center/h20/",
    "h800": "NVIDIA H800 Tensor Core GPU (China market: the H100 with NVLink at 400 GB/s), "
    "https://www.nvidia.cn/data-center/h800/",
    "a800": "NVIDIA A800 Tensor Core GPU (China market: the A100 with NVLink at 400 GB/s), "
    "https://www.nvidia.cn/data-center/a800/",
    "gb200": "NVIDIA GB200 NVL72 datasheet (72 GPUs: 13.4 TB HBM3e, 576 TB/s), "
    "https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
    "gh200": "NVIDIA GH200 Grace Hopper Superchip datasheet, https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
    "b200": "NVIDIA DGX B200 datasheet (8 GPUs: 1,440 GB, 64 TB/s), https://www.nvidia.com/en-us/data-center/dgx-b200/",
    "a100": "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/",
    "a10": "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
    "a30": "NVIDIA A30 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/products/a30-gpu/",
    "a40": "NVIDIA A40 datasheet, https://www.nvidia.com/en-us/data-center/a40/",
    "rtxa6000": "NVIDIA RTX A6000 datasheet, https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
    "a10g": "Amazon EC2 G5 instances (NVIDIA A10G, 24 GB per GPU), https://aws.amazon.com/ec2/instance-types/g5/",
    "l4": "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/",
    "l40": "NVIDIA L40 GPU datasheet, https://www.nvidia.com/en-us/data-center/l40/",
    "l40s": "NVIDIA L40S GPU datasheet, https://www.nvidia.com/en-us/data-center/l40s/",
    "l20": "NVIDIA L20 product brief (China market), https://www.nvidia.cn/data-center/l20/",
    "rtx6000ada": "NVIDIA RTX 6000 Ada Generation datasheet, https://www.nvidia.com/en-us/design-visualization/rtx-6000/",
    "rtx4090": "NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090: 384-bit, 21 Gbps, 1,008 GB/s), "
    "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/",
    "t4": "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/tesla-t4/",
    "v100": "NVIDIA V100 Tensor Core GPU datasheet, "
    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as the ledger sees it (see the module docstring for units and sources)."""

    name: str  # the NVML device name, exactly
    memory_bytes: float
    peak_bandwidth: float  # bytes/s, DRAM theoretical peak
    pcie_bandwidth: float  # bytes/s per direction of its PCIe x16 link
    peak_flops: float | None = None
    label: str = ""  # what people call it: "H100 SXM 80GB"
    pcie_generation: int | None = None
    host_link_bandwidth: float | None = None  # bytes/s per direction to host memory, if not PCIe
    host_link: str = ""  # "PCIe 5.0 x16", "NVLink-C2C"
    nvlink_bandwidth: float | None = None  # bytes/s per GPU, both directions together (datasheet)
    bus_width_bits: int | None = None
    max_memory_clock_mhz: int | None = None
    source: str = ""  # a key of SOURCES, or what the figures came from
    note: str = ""

    @property
    def host_bandwidth(self) -> float:
        """Bytes/s per direction between this GPU and host memory (KV offload's link)."""
        return self.host_link_bandwidth or self.pcie_bandwidth

    @property
    def nvml_peak_bandwidth(self) -> float | None:
        """The peak NVML's bus width and max memory clock give for this GPU, where published."""
        if self.bus_width_bits and self.max_memory_clock_mhz:
            return nvml_peak_bandwidth(self.bus_width_bits, self.max_memory_clock_mhz)
        return None

    def to_json(self) -> dict[str, str | float | int | None]:
        return {
            "name": self.name,
            "label": self.label or self.name,
            "memory_bytes": self.memory_bytes,
            "peak_bandwidth": self.peak_bandwidth,
            "pcie_generation": self.pcie_generation,
            "pcie_bandwidth": self.pcie_bandwidth,
            "host_link": self.host_link,
            "host_bandwidth": self.host_bandwidth,
            "nvlink_bandwidth": self.nvlink_bandwidth,
            "bus_width_bits": self.bus_width_bits,
            "max_memory_clock_mhz": self.max_memory_clock_mhz,
            "peak_flops": self.peak_flops,
            "source": SOURCES.get(self.source, self.source),
        }


def nvml_peak_bandwidth(bus_width_bits: float, max_memory_clock_mhz: float) -> float:
    """Peak DRAM bandwidth in bytes/s: bus width x max memory clock x 2 (double data rate) / 8.

    With the clocks NVML reports this reproduces the datasheets for HBM and GDDR alike
    (H100 SXM: 5,120 bit x 2,619 MHz x 2 / 8 = 3.35 TB/s; L4: 192 x 6,251 -> 300 GB/s).
    """
    return bus_width_bits * max_memory_clock_mhz * 1e6 * DATA_RATE / 8


def _gpu(
    name: str,
    label: str,
    memory_gib: float,
    bandwidth_gbps: float,
    pcie: int,
    source: str,
    tflops: float | None = None,
    nvlink_gbps: float | None = None,
    bus: int | None = None,
    clock: int | None = None,
    note: str = "",
    host_link: tuple[str, float] | None = None,
) -> GpuSpec:
    link, link_bandwidth = host_link or (f"PCIe {pcie}.0 x16", None)
    return GpuSpec(
        name=name,
        label=label,
        memory_bytes=memory_gib * GIB,
        peak_bandwidth=bandwidth_gbps * GB,
        pcie_bandwidth=PCIE_X16_BANDWIDTH[pcie],
        peak_flops=tflops * TFLOPS if tflops else None,
        pcie_generation=pcie,
        host_link=link,
        host_link_bandwidth=link_bandwidth,
        nvlink_bandwidth=nvlink_gbps * GB if nvlink_gbps else None,
        bus_width_bits=bus,
        max_memory_clock_mhz=clock,
        source=source,
        note=note,
    )


NVLINK_C2C = ("NVLink-C2C", 450 * GB)  # 900 GB/s between Grace and Hopper, both directions together

GPUS: tuple[GpuSpec, ...] = (
    # Hopper
    _gpu("NVIDIA H100 80GB HBM3", "H100 SXM 80GB", 80, 3350, 5, "h100", 989, 900, 5120, 2619),
    _gpu(
        "NVIDIA H100 PCIe",
        "H100 PCIe 80GB",
        80,
        2000,
        5,
        "h100",
        756,
        600,
        5120,
        1593,
        note="the datasheet says 2 TB/s; NVML's clock gives 2,039 GB/s",
    ),
    _gpu(
        "NVIDIA H100 NVL",
        "H100 NVL 94GB",
        94,
        3900,
        5,
        "h100",
        835,
        600,
        6144,
        2619,
        note="the datasheet says 3.9 TB/s; NVML's clock gives 4,023 GB/s",
    ),
    _gpu(
        "NVIDIA H200",
        "H200 SXM 141GB",
        141,
        4800,
        5,
        "h200",
        989,
        900,
        6144,
        3201,
        note="the datasheet says 4.8 TB/s; NVML's clock gives 4,917 GB/s",
    ),
    _gpu("NVIDIA H200 NVL", "H200 NVL 141GB", 141, 4800, 5, "h200", 835, 900),
    _gpu("NVIDIA H20", "H20 96GB", 96, 4000, 5, "h20", 148, 900),
    _gpu("NVIDIA H800", "H800 SXM 80GB", 80, 3350, 5, "h800", 989, 400, 5120, 2619),
    _gpu(
        "NVIDIA H800 PCIe",
        "H800 PCIe 80GB",
        80,
        2000,
        5,
        "h800",
        756,
        400,
        5120,
        1593,
        note="the datasheet says 2 TB/s; NVML's clock gives 2,039 GB/s",
    ),
    _gpu(
        "NVIDIA GH200 480GB",
        "GH200 96GB HBM3",
        96,
        4000,
        5,
        "gh200",
        989,
        900,
        6144,
        2619,
        note="the datasheet says 4 TB/s; NVML's clock gives 4,023 GB/s",
        host_link=NVLINK_C2C,
    ),
    _gpu("NVIDIA GH200 144G HBM3e", "GH200 144GB HBM3e", 144, 4900, 5, "gh200", 989, 900, host_link=NVLINK_C2C),
    # Blackwell
    _gpu("NVIDIA B200", "B200 180GB", 180, 8000, 5, "b200", 2250, 1800),
    _gpu("NVIDIA GB200", "GB200 186GB", 186, 8000, 5, "gb200", 2500, 1800, host_link=NVLINK_C2C),
    # Ampere
    _gpu("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB", 40, 1555, 4, "a100", 312, 600, 5120, 1215),
    _gpu("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 80, 2039, 4, "a100", 312, 600, 5120, 1593),
    _gpu("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 40, 1555, 4, "a100", 312, 600, 5120, 1215),
    _gpu("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 80, 1935, 4, "a100", 312, 600, 5120, 1512),
    _gpu("NVIDIA A800-SXM4-80GB", "A800 SXM 80GB", 80, 2039, 4, "a800", 312, 400, 5120, 1593),
    _gpu("NVIDIA A800 80GB PCIe", "A800 PCIe 80GB", 80, 1935, 4, "a800", 312, 400, 5120, 1512),
    _gpu("NVIDIA A30", "A30 24GB", 24, 933, 4, "a30", 165, 200),
    _gpu("NVIDIA A40", "A40 48GB", 48, 696, 4, "a40", 150),
    _gpu("NVIDIA RTX A6000", "RTX A6000 48GB", 48, 768, 4, "rtxa6000", 155),
    _gpu("NVIDIA A10", "A10 24GB", 24, 600, 4, "a10", 125, None, 384, 6251),
    _gpu(
        "NVIDIA A10G",
        "A10G 24GB (AWS)",
        24,
        600,
        4,
        "a10g",
        note="an AWS variant of the A10; AWS publishes the memory, the bandwidth is the A10's GDDR6 600 GB/s",
    ),
    # Ada Lovelace
    _gpu("NVIDIA L4", "L4 24GB", 24, 300, 4, "l4", 121, None, 192, 6251),
    _gpu("NVIDIA L40", "L40 48GB", 48, 864, 4, "l40", 181),
    _gpu("NVIDIA L40S", "L40S 48GB", 48, 864, 4, "l40s", 362, None, 384, 9001),
    _gpu("NVIDIA L20", "L20 48GB", 48, 864, 4, "l20", 120),
    _gpu("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada 48GB", 48, 960, 4, "rtx6000ada", 364),
    _gpu("NVIDIA GeForce RTX 4090", "RTX 4090 24GB", 24, 1008, 4, "rtx4090", None, None, 384, 10501),
    # Turing, Volta
    _gpu("Tesla T4", "T4 16GB", 16, 320, 3, "t4", 65, None, 256, 5001),
    _gpu("Tesla V100-SXM2-16GB", "V100 SXM2 16GB", 16, 900, 3, "v100", 125, 300, 4096, 877),
    _gpu("Tesla V100-SXM2-32GB", "V100 SXM2 32GB", 32, 900, 3, "v100", 125, 300, 4096, 877),
    _gpu("Tesla V100-PCIE-16GB", "V100 PCIe 16GB", 16, 900, 3, "v100", 112, None, 4096, 877),
    _gpu("Tesla V100-PCIE-32GB", "V100 PCIe 32GB", 32, 900, 3, "v100", 112, None, 4096, 877),
    _gpu("Tesla V100S-PCIE-32GB", "V100S PCIe 32GB", 32, 1134, 3, "v100", 130),
)
GPU_CATALOGUE: dict[str, GpuSpec] = {g.name: g for g in GPUS}

# Short names people type, each naming exactly one row (no alias for an ambiguous "V100" or "GH200").
GPU_ALIASES: dict[str, str] = {
    "H100": "NVIDIA H100 80GB HBM3",
    "H100-SXM": "NVIDIA H100 80GB HBM3",
    "H100-PCIE": "NVIDIA H100 PCIe",
    "H100-NVL": "NVIDIA H100 NVL",
    "H200": "NVIDIA H200",
    "H200-NVL": "NVIDIA H200 NVL",
    "H20": "NVIDIA H20",
    "H800": "NVIDIA H800",
    "H800-SXM": "NVIDIA H800",
    "H800-PCIE": "NVIDIA H800 PCIe",
    "GB200": "NVIDIA GB200",
    "GH200-96GB": "NVIDIA GH200 480GB",
    "GH200-144GB": "NVIDIA GH200 144G HBM3e",
    "B200": "NVIDIA B200",
    "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100-SXM4-80GB",
    "A100-40GB-PCIE": "NVIDIA A100-PCIE-40GB",
    "A100-80GB-PCIE": "NVIDIA A100 80GB PCIe",
    "A800-80GB": "NVIDIA A800-SXM4-80GB",
    "A800-80GB-PCIE": "NVIDIA A800 80GB PCIe",
    "A30": "NVIDIA A30",
    "A40": "NVIDIA A40",
    "RTXA6000": "NVIDIA RTX A6000",
    "A6000": "NVIDIA RTX A6000",
    "A10": "NVIDIA A10",
    "A10G": "NVIDIA A10G",
    "L4": "NVIDIA L4",
    "L40": "NVIDIA L40",
    "L40S": "NVIDIA L40S",
    "L20": "NVIDIA L20",
    "RTX6000-ADA": "NVIDIA RTX 6000 Ada Generation",
    "RTX4090": "NVIDIA GeForce RTX 4090",
    "T4": "Tesla T4",
    "V100-SXM2-16GB": "Tesla V100-SXM2-16GB",
    "V100-SXM2-32GB": "Tesla V100-SXM2-32GB",
    "V100-PCIE-16GB": "Tesla V100-PCIE-16GB",
    "V100-PCIE-32GB": "Tesla V100-PCIE-32GB",
    "V100S": "Tesla V100S-PCIE-32GB",
}


def _key(name: str) -> str:
    return " ".join(name.split()).casefold()


_BY_KEY: dict[str, GpuSpec] = {_key(g.name): g for g in GPUS} | {
    _key(alias): GPU_CATALOGUE[name] for alias, name in GPU_ALIASES.items()
}


def lookup_gpu(name: str) -> GpuSpec | None:
    """The row for an NVML device name (``NVIDIA H100 80GB HBM3``) or a short alias (``H100``);
    case and repeated spaces do not matter, anything else does. None when unknown."""
    return _BY_KEY.get(_key(name))


def closest_gpu_names(name: str, n: int = 3) -> list[str]:
    """The NVML names most like ``name``, best first (for the unknown-GPU message): the rows of the
    same model number first (``V100`` -> the V100s), then the most similar spellings."""
    key = _key(name)
    names = {_key(g.name): g.name for g in GPUS}

    def similarity(k: str) -> float:
        return difflib.SequenceMatcher(None, key, k).ratio()

    same_model: list[str] = []
    for token in re.findall(r"[a-z]*\d+[a-z\d]*", key):
        same_model = sorted((k for k in names if token in k), key=similarity, reverse=True)
        if same_model:
            break
    similar = difflib.get_close_matches(key, list(names), n=n, cutoff=0.3)
    ordered = list(dict.fromkeys(same_model + similar))
    return [names[k] for k in ordered[:n]]


class UnknownGpuError(ValueError):
    """A GPU name the catalogue does not know."""


def gpu_spec(name: str) -> GpuSpec:
    """The row for ``name``; ``UnknownGpuError`` (one line, with the closest names) otherwise."""
    spec = lookup_gpu(name)
    if spec is None:
        closest = closest_gpu_names(name)
        hint = f" (closest: {', '.join(repr(c) for c in closest)})" if closest else ""
        raise UnknownGpuError(
            f"unknown GPU {name!r}: not in the catalogue{hint}; give its peak DRAM bandwidth with "
            "--gpu-peak-bandwidth BYTES_PER_S (and its memory with --gpu-memory-bytes)"
        )
    return spec


class AmbiguousGpuError(UnknownGpuError):
    """A short name several rows answer to (``H100``: SXM, PCIe or NVL); ``candidates`` their NVML names."""

    def __init__(self, message: str, candidates: list[str]) -> None:
        super().__init__(message)
        self.candidates = candidates


_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce"})


def _tokens(text: str) -> list[str]:
    """The words of a GPU name as people type it: case, dashes and vendor words aside, memory
    sizes as ``80gb`` (``80GB``, ``80 GB``, ``80G`` alike)."""
    words = re.sub(r"[-_/,()]", " ", text.casefold()).split()
    out: list[str] = []
    for word in words:
        if word in ("gb", "gib") and out and out[-1].isdigit():
            out[-1] += "gb"
        elif word not in _VENDOR_WORDS:
            out.append(re.sub(r"^(\d+)(g|gib)$", r"\1gb", word))
    return out


def _row_tokens(gpu: GpuSpec) -> set[str]:
    """Every word of a row's NVML name and label, and its label's model with its size (``L40S``)."""
    return set(_tokens(gpu.name)) | set(_tokens(gpu.label))


def _matches(query: str, row: set[str]) -> bool:
    """A typed word names a row's word: the same, or its family (``sxm`` for ``sxm4``, ``pcie``)."""
    return query in row or any(w.startswith(query) and w[len(query) :].isdigit() for w in row if query.isalpha())


def gpu_candidates(name: str) -> list[GpuSpec]:
    """The rows a short name (``H100 SXM``, ``A100 40GB``, ``L40S``) could mean: every typed word
    names one of the row's, and the first (the model: ``H100``) names its model exactly."""
    words = _tokens(name)
    if not words:
        return []
    found = []
    for gpu in GPUS:
        row = _row_tokens(gpu)
        model = _tokens(gpu.label)[0] if gpu.label else ""
        if all(_matches(w, row) for w in words) and (model in words or "".join(words) == model):
            found.append(gpu)
    return found


def short_name(gpu: GpuSpec) -> str:
    """The shortest name that means this row alone: its model, then with its form factor, its
    memory, or both (``H100 SXM``, ``A100 SXM 40GB``, ``L40S``); the NVML name if none does."""
    words = gpu.label.split() if gpu.label else []
    if not words:
        return gpu.name
    model, rest = words[0], words[1:]
    if not any(c.isdigit() for c in model) and rest:  # "RTX 4090": the model is two words
        model, rest = f"{model} {rest[0]}", rest[1:]
    tries = [[model]] + [[model, w] for w in rest] + [[model, *rest]]
    for attempt in tries:
        text = " ".join(attempt)
        if [g.name for g in gpu_candidates(text)] == [gpu.name]:
            return text
    return gpu.name


def resolve_gpu(name: str) -> GpuSpec:
    """The row a user's ``--gpu`` names: an exact NVML device name, or a short name that means one
    row (``H100 SXM``, ``H100 PCIe``, ``L40S``). ``AmbiguousGpuError`` listing the candidates where it
    means several (``H100``, ``A100``), ``UnknownGpuError`` with the closest names where none."""
    exact = _BY_KEY.get(_key(name))
    if exact is not None and _key(name) in {_key(g.name) for g in GPUS}:
        return exact
    found = gpu_candidates(name)
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        listed = "; ".join(f"{short_name(g)!r} ({g.name})" for g in found)
        raise AmbiguousGpuError(
            f"--gpu {name!r} could be {len(found)} GPUs: {listed}; give one of these (see --list-gpus)",
            [g.name for g in found],
        )
    if exact is not None:  # an older alias that names one row (RTX4090, V100S)
        return exact
    return gpu_spec(name)


def custom_gpu(peak_bandwidth: float, memory_bytes: float | None, base: GpuSpec | None = None) -> GpuSpec:
    """A GPU described by its figures: ``base`` with its peak (and memory) replaced, or a PCIe 4.0
    card named "custom" when there is no base."""
    if peak_bandwidth <= 0 or (memory_bytes is not None and memory_bytes <= 0):
        raise ValueError("a GPU's peak bandwidth and memory must be positive")
    if base is not None:
        return replace(
            base,
            peak_bandwidth=peak_bandwidth,
            memory_bytes=memory_bytes or base.memory_bytes,
            source="--gpu-peak-bandwidth" if peak_bandwidth != base.peak_bandwidth else base.source,
            bus_width_bits=None if peak_bandwidth != base.peak_bandwidth else base.bus_width_bits,
            max_memory_clock_mhz=None if peak_bandwidth != base.peak_bandwidth else base.max_memory_clock_mhz,
        )
    if memory_bytes is None:
        raise ValueError("a GPU outside the catalogue needs --gpu-memory-bytes as well as --gpu-peak-bandwidth")
    return GpuSpec(
        name="custom",
        label="custom GPU",
        memory_bytes=memory_bytes,
        peak_bandwidth=peak_bandwidth,
        pcie_bandwidth=PCIE_X16_BANDWIDTH[4],
        pcie_generation=4,
        host_link="PCIe 4.0 x16 (assumed)",
        source="--gpu-peak-bandwidth and --gpu-memory-bytes",
    )
