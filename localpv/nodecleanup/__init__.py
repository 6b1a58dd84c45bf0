"""``localpv node-cleanup``: a cluster-wide Deployment that frees the PVCs and PVs pinned to
Nodes that were deleted (opt-in per StorageClass; data is never touched)."""
