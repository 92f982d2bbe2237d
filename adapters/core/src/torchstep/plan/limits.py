"""Sanity limits of the spec layer: far above any real node, low enough to catch unit
mistakes (MB vs bytes, milliseconds given as seconds), and the capability keys with a
known meaning.

Example::

    >>> MAX_MEM_MB // 1024 // 1024  # TiB
    64
"""

from __future__ import annotations

#: Capability keys with a known meaning: Kubernetes node labels (→ nodeSelector).
KNOWN_CAPABILITIES = frozenset(
    {
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "cloud.google.com/gke-accelerator",
        "cloud.google.com/gke-nodepool",
        "eks.amazonaws.com/nodegroup",
        "karpenter.sh/capacity-type",
        "nvidia.com/gpu.product",
    }
)

MAX_CPU = 4096
MAX_GPU = 256
MAX_MEM_MB = 64 * 1024 * 1024  # 64 TiB
MAX_REPLICAS = 100_000
MAX_RETRIES = 1000
MAX_NPROC = 4096


#: Upper bound of any duration option (ten years): catches milliseconds given as seconds.
MAX_SECONDS = 10 * 365 * 86400
#: Longest value shown in a decision (explain tables stay readable).
SHOW_MAX = 200
