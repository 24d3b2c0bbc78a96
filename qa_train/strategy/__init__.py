"""The only package that knows DeepSpeed or FSDP: accelerator, checkpoints, export, launch."""
