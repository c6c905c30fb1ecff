"""The GPU catalogue: every row, exact NVML names, the unknown-name error, and the NVML formula.

The datasheet figures are written out here a second time on purpose: a typo in the catalogue (or a
row silently dropped) fails one of these rows.
"""

from __future__ import annotations

import pytest

from kvdoctor.ledger import gpus as G
from tests.support.errors import one_line_error

GIB = 1024**3

# NVML device name -> (memory GiB, peak GB/s, PCIe generation), from the vendor datasheets.
DATASHEET = {
    "NVIDIA H100 80GB HBM3": (80, 3350, 5),
    "NVIDIA H100 PCIe": (80, 2000, 5),
    "NVIDIA H100 NVL": (94, 3900, 5),
    "NVIDIA H200": (141, 4800, 5),
    "NVIDIA H200 NVL": (141, 4800, 5),
    "NVIDIA H20": (96, 4000, 5),
    "NVIDIA H800": (80, 3350, 5),
    "NVIDIA H800 PCIe": (80, 2000, 5),
    "NVIDIA GB200": (186, 8000, 5),
    "NVIDIA GH200 480GB": (96, 4000, 5),
    "NVIDIA GH200 144G HBM3e": (144, 4900, 5),
    "NVIDIA B200": (180, 8000, 5),
    "NVIDIA A100-SXM4-40GB": (40, 1555, 4),
    "NVIDIA A100-SXM4-80GB": (80, 2039, 4),
    "NVIDIA A100-PCIE-40GB": (40, 1555, 4),
    "NVIDIA A100 80GB PCIe": (80, 1935, 4),
    "NVIDIA A800-SXM4-80GB": (80, 2039, 4),
    "NVIDIA A800 80GB PCIe": (80, 1935, 4),
    "NVIDIA A30": (24, 933, 4),
    "NVIDIA A40": (48, 696, 4),
    "NVIDIA RTX A6000": (48, 768, 4),
    "NVIDIA A10": (24, 600, 4),
    "NVIDIA A10G": (24, 600, 4),
    "NVIDIA L4": (24, 300, 4),
    "NVIDIA L40": (48, 864, 4),
    "NVIDIA L40S": (48, 864, 4),
    "NVIDIA L20": (48, 864, 4),
    "NVIDIA RTX 6000 Ada Generation": (48, 960, 4),
    "NVIDIA GeForce RTX 4090": (24, 1008, 4),
    "Tesla T4": (16, 320, 3),
    "Tesla V100-SXM2-16GB": (16, 900, 3),
    "Tesla V100-SXM2-32GB": (32, 900, 3),
    "Tesla V100-PCIE-16GB": (16, 900, 3),
    "Tesla V100-PCIE-32GB": (32, 900, 3),
    "Tesla V100S-PCIE-32GB": (32, 1134, 3),
}
PCIE_PER_DIRECTION = {3: 15.75e9, 4: 31.5e9, 5: 63e9}


def test_the_catalogue_has_exactly_the_datasheet_rows():
    assert set(G.GPU_CATALOGUE) == set(DATASHEET)
    assert len(G.GPUS) == len(G.GPU_CATALOGUE)  # no name twice


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_every_row_matches_its_datasheet_and_cites_it(name):
    memory_gib, peak_gbps, pcie = DATASHEET[name]
    gpu = G.lookup_gpu(name)
    assert gpu is not None and gpu.name == name
    assert gpu.memory_bytes == memory_gib * GIB
    assert gpu.peak_bandwidth == peak_gbps * 1e9
    assert gpu.pcie_generation == pcie and gpu.pcie_bandwidth == PCIE_PER_DIRECTION[pcie]
    assert gpu.source in G.SOURCES and G.SOURCES[gpu.source].count("https://") == 1
    assert gpu.label and gpu.host_link


def test_grace_hopper_offloads_over_nvlink_c2c_not_pcie():
    for name in ("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e", "NVIDIA GB200"):
        gpu = G.gpu_spec(name)
        assert gpu.host_link == "NVLink-C2C" and gpu.host_bandwidth == 450e9
    assert G.gpu_spec("NVIDIA H100 PCIe").host_bandwidth == 63e9


@pytest.mark.parametrize(
    ("asked", "row"),
    [
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),  # was the SXM's 3,350 GB/s through a loose pattern
        ("NVIDIA GH200 480GB", "NVIDIA GH200 480GB"),  # was the H200's 141 GB
        ("Tesla T4", "Tesla T4"),
        ("NVIDIA A10G", "NVIDIA A10G"),
        ("nvidia  h100 80gb hbm3", "NVIDIA H100 80GB HBM3"),  # case and repeated spaces do not matter
        ("H100", "NVIDIA H100 80GB HBM3"),
        ("a100-80gb", "NVIDIA A100-SXM4-80GB"),
        ("GH200-144GB", "NVIDIA GH200 144G HBM3e"),
        # the names NVML reports on the China-market and workstation parts
        ("NVIDIA H800", "NVIDIA H800"),
        ("NVIDIA A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB"),
        ("NVIDIA L20", "NVIDIA L20"),
        ("NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation"),
        ("NVIDIA RTX A6000", "NVIDIA RTX A6000"),
        ("nvidia rtx 6000 ada generation", "NVIDIA RTX 6000 Ada Generation"),
        ("A6000", "NVIDIA RTX A6000"),
    ],
)
def test_names_resolve_exactly(asked, row):
    assert G.gpu_spec(asked).name == row


@pytest.mark.parametrize("name", ["NVIDIA H900", "NVIDIA H100", "V100", "GH200", "NVIDIA A100", "Z80"])
def test_an_unknown_or_ambiguous_name_is_an_error_naming_the_closest_and_the_flag(name):
    assert G.lookup_gpu(name) is None
    message = one_line_error(G.UnknownGpuError, G.gpu_spec, name)
    assert f"unknown GPU {name!r}" in message and "--gpu-peak-bandwidth" in message


def test_the_closest_names_are_the_same_model_first_then_similar_spellings():
    assert G.closest_gpu_names("V100") == ["Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-16GB"]
    assert set(G.closest_gpu_names("NVIDIA A100")) < {n for n in DATASHEET if n.startswith("NVIDIA A100")}
    assert G.closest_gpu_names("GH200")[:2] == ["NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"]
    assert G.closest_gpu_names("NVIDIA H900")[0] in ("NVIDIA H800", "NVIDIA H200")  # no H900: the nearest spelling
    assert G.closest_gpu_names("Z80") == []
    with pytest.raises(G.UnknownGpuError) as info:
        G.gpu_spec("NVIDIA H20 NVL16")
    assert "(closest: " in str(info.value) and "'NVIDIA H20'" in str(info.value)


def test_every_alias_names_a_row():
    for alias, name in G.GPU_ALIASES.items():
        assert G.lookup_gpu(alias) is G.GPU_CATALOGUE[name]


# ------------------------------------------------------------------------------- the NVML formula


def test_the_formula_on_the_issue_example():
    # H100 SXM: 5,120 bits x 2,619 MHz x 2 / 8 = 3.352 TB/s
    assert G.nvml_peak_bandwidth(5120, 2619) == 5120 * 2619e6 * 2 / 8 == pytest.approx(3.352e12, rel=1e-4)


PUBLISHED = [g for g in G.GPUS if g.bus_width_bits and g.max_memory_clock_mhz]


def test_bus_width_and_clock_are_published_for_most_rows():
    assert len(PUBLISHED) >= 15
    assert {g.name for g in PUBLISHED} >= {"NVIDIA H100 80GB HBM3", "NVIDIA L4", "Tesla T4", "NVIDIA A100-SXM4-80GB"}


@pytest.mark.parametrize("gpu", PUBLISHED, ids=lambda g: g.name)
def test_the_formula_reproduces_every_row_whose_bus_and_clock_are_published(gpu):
    """Within 0.3% of the datasheet; where NVIDIA's datasheet rounds down more than that, the row
    says so, with the figure NVML's clock gives, and it is within 3.5%."""
    formula = G.nvml_peak_bandwidth(gpu.bus_width_bits, gpu.max_memory_clock_mhz)
    assert gpu.nvml_peak_bandwidth == formula
    off = formula / gpu.peak_bandwidth - 1
    if abs(off) <= 0.003:
        assert not gpu.note, "a note for a row that matches"
    else:
        assert 0 < off <= 0.035
        assert f"{formula / 1e9:,.0f} GB/s" in gpu.note


def test_a_custom_gpu_needs_both_figures_and_keeps_the_catalogue_row_otherwise():
    custom = G.custom_gpu(1e12, 32e9)
    assert (custom.name, custom.peak_bandwidth, custom.memory_bytes) == ("custom", 1e12, 32e9)
    with pytest.raises(ValueError, match="--gpu-memory-bytes"):
        G.custom_gpu(1e12, None)
    faster = G.custom_gpu(3.0e12, None, G.gpu_spec("H100"))
    assert faster.peak_bandwidth == 3.0e12 and faster.memory_bytes == 80 * GIB and faster.nvml_peak_bandwidth is None
