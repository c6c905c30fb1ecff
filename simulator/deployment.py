"""The simulated deployment: the model, the GPUs and the engine flags that matter to the physics.

Tensor parallel over ``tensor_parallel`` GPUs of the same model is the ledger's arithmetic
(ledger/arithmetic.py, as ``kvdoctor ledger --tp``): each GPU holds its share of the weights and of the KV
heads, its own KV pool, and reads its share every decode step; the all-reduces go over NVLink.
The simulation models one GPU of the group (they carry the same load).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvdoctor.ledger.arithmetic import (
    DEFAULT_HOST_BANDWIDTH,
    all_reduce_cost,
    check_tensor_parallel,
    host_transfer_seconds,
    kv_bytes_per_token_per_gpu,
    kv_pool_bytes,
)
from kvdoctor.ledger.gpus import GpuSpec, gpu_spec
from kvdoctor.ledger.model import ModelShape, dtype_bytes
from kvdoctor.signals.units import GIB

DEFAULT_GPU = gpu_spec("H100")  # H100 SXM 80GB

# The served model's Hugging Face config.json (meta-llama/Llama-2-7b-chat-hf): the demo hands it to
# the exporter as --model, so the exporter's ledger sees the same shape as the physics.
LLAMA_2_7B_CONFIG: dict = {
    "_name_or_path": "meta-llama/Llama-2-7b-chat-hf",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}


@dataclass(frozen=True)
class EngineConfig:
    """The simulated deployment: model, GPU and the engine flags that matter to the physics.

    The default is Llama-2-7B (32 KV heads: 512 KiB of KV per token, 4x Llama-3.1-8B's) on one
    H100 SXM with vLLM's defaults: the pool holds ~115k tokens, so every KV effect shows within
    seconds, and the "use a GQA model" advice has something to say.
    """

    model_name: str = "meta-llama/Llama-2-7b-chat-hf"
    # The model: its config.json, or only its shape (then there is no config.json to hand out).
    # With neither, Llama-2-7B.
    model_config: Mapping | None = None
    shape: ModelShape | None = None
    gpu: GpuSpec = DEFAULT_GPU
    tensor_parallel: int = 1  # GPUs the model is split over (vLLM --tensor-parallel-size)
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 3.0e9  # activations, CUDA graphs, sampler: not KV
    cuda_context_bytes: float = 0.55e9  # memory used outside the engine's share
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    kv_cache_dtype: str = "auto"
    memory_efficiency: float = 0.92  # share of peak HBM bandwidth a memory-bound step reaches
    compute_efficiency: float = 0.6  # share of peak FLOP/s a compute-bound step reaches
    pcie_efficiency: float = 0.8  # share of PCIe peak a bulk KV copy reaches
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH
    step_overhead_seconds: float = 0.0006  # scheduling and launches per step (CUDA graphs)
    sm_floor: float = 0.3  # SM activity of a memory-bound step: kernels resident, waiting on DRAM
    admission_watermark: float = 0.01  # share of blocks kept free when admitting
    step_jitter: float = 0.03  # relative standard deviation of a step's GPU time
    cpu_offload_bytes: float = 64 * GIB  # the offloading connector's CPU tier

    def __post_init__(self) -> None:
        if self.model_config is None and self.shape is None:
            object.__setattr__(self, "model_config", dict(LLAMA_2_7B_CONFIG))
        if self.shape is None:
            object.__setattr__(self, "shape", ModelShape.from_hf_config(dict(self.model_config), name=self.model_name))
        check_tensor_parallel(self.shape, self.tensor_parallel)  # ValueError: vLLM would refuse it too

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token occupies on each GPU (its share of the KV heads)."""
        dtype = None if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
        return kv_bytes_per_token_per_gpu(self.shape, self.tensor_parallel, dtype)

    @property
    def kv_pool_bytes(self) -> float:
        """Each GPU's KV pool: its share of memory less its share of the weights and the reserve."""
        return kv_pool_bytes(
            self.shape, self.gpu, self.gpu_memory_utilization, self.activation_reserve_bytes, self.tensor_parallel
        )

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.shape.weight_bytes / self.tensor_parallel

    def all_reduce_seconds(self, batch: int) -> float:
        """The all-reduces of one decode step of ``batch`` sequences (0 on one GPU)."""
        cost = all_reduce_cost(self.shape, self.gpu, max(1, batch), self.tensor_parallel)
        return cost.seconds if cost is not None else 0.0

    @property
    def num_gpu_blocks(self) -> int:
        return int(self.kv_pool_bytes // (self.kv_bytes_per_token * self.block_size))

    @property
    def capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def num_cpu_blocks(self) -> int:
        return int(self.cpu_offload_bytes // (self.kv_bytes_per_token * self.block_size))

    @property
    def gpu_name(self) -> str:
        return self.gpu.name  # the catalogue is keyed by the NVML device name

    @property
    def peak_flops(self) -> float:
        return self.gpu.peak_flops or 100e12

    @property
    def memory_used_bytes(self) -> float:
        """vLLM takes its whole share up front: weights, activations and the KV pool."""
        return self.gpu.memory_bytes * self.gpu_memory_utilization + self.cuda_context_bytes

    def host_copy_seconds(self, nbytes: float) -> float:
        """A bulk KV copy between CPU memory and the GPU, bound by the slower of the two links."""
        return host_transfer_seconds(nbytes, self.host_bandwidth, self.gpu.pcie_bandwidth * self.pcie_efficiency)

    def activation_bytes(self, prefill_tokens: float) -> float:
        """HBM traffic of prefill activations on each GPU: each layer reads and writes the hidden
        state a few times and the MLP's intermediate once (a rough constant; decode's is negligible),
        the MLP's share split over the GPUs."""
        s = self.shape
        inter = 2.7 * s.hidden_size / self.tensor_parallel  # ~intermediate_size of Llama-style MLPs
        return prefill_tokens * s.num_layers * (8 * s.hidden_size + 3 * inter) * dtype_bytes(s.dtype)
