"""The runtime (tritondtr.runtime) against eager PyTorch, one subject per file: what a session
tracks and how it recomputes, its options, devices, costs and reports, and PyTorch's features
under it (autocast, torch.compile, DDP, FSDP2, op_db)."""
