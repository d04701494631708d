"""Paper scale on one node: where each process runs (placement) and whether it fits (memory), checked before
any work."""
