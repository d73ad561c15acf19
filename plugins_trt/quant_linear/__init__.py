"""Quantized linear (FP8 per-channel, FP8 128x128-block, NVFP4 weight-only): torch reference."""
