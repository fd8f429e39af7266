"""What the dcgm-exporter fixtures hold (``tests/fixtures/dcgm``, sources in its README).

One place for the files' names and the facts the tests read from them: the node of 8 GPUs of
which vLLM's pod holds GPUs 2 and 5, and the MIG node.
"""

from __future__ import annotations

from exporter.gpu.dcgm import PodIdentity
from tests import paths

DCGM = paths.FIXTURES / "dcgm"
V3_MAPPED = "dcgm-exporter-3.3.9-3.6.1_8gpu_pod-mapping.prom"
V3_UNMAPPED = "dcgm-exporter-3.3.9-3.6.1_8gpu_no-pod-mapping.prom"
V4_MAPPED = "dcgm-exporter-4.5.3-4.8.2_8gpu_pod-mapping.prom"
V4_OLD_NAMES = "dcgm-exporter-4.5.3-4.8.2_8gpu_old-namespace.prom"
V4_MIG = "dcgm-exporter-4.5.3-4.8.2_mig.prom"
#: vLLM's pod on the 8-GPU node, and its two GPUs there.
VLLM_POD = PodIdentity("llama-70b-5c8d-qw7zt", "inference")
GPU2 = "GPU-b5c6d7e8-f9a0-4b1c-8d2e-3f4a5b6c7d03"
GPU5 = "GPU-e2f3a4b5-c6d7-4e8f-9a0b-1c2d3e4f5a06"
#: Another pod on that node (the embedding model), and its one GPU there.
EMBED_POD = PodIdentity("embed-bge-7d9f-x2k4p", "inference")
GPU0 = "GPU-3f1c2a9e-8b7d-4e21-9c0a-5d6e7f8a9b01"
MIG_POD = PodIdentity("llama-8b-6f7a-mig01", "inference")
#: The fixtures' node: NVML total and driver reservation of an H100 80GB HBM3, in MiB.
TOTAL_MIB, RESERVED_MIB = 81_559, 469
