"""Shared scratch buffers (plugins_trt/buffers.py): a buffer a CUDA graph was captured with must outlive the graph, so
one outgrown by a larger launch is kept, never freed; the GEMM's stream-K counters and the GDN's sync counters grow
this way."""

import gc
import weakref

import pytest
import torch

from atlas.plugins_trt import buffers


def test_an_outgrown_buffer_is_kept_and_a_smaller_request_reuses_the_larger():
    cache = {}
    first = buffers.grown(cache, "dev", 10, lambda n: torch.zeros(n, dtype=torch.int32))
    assert first.numel() == 10 and buffers.grown(cache, "dev", 4, lambda n: torch.zeros(n)) is first
    alive = weakref.ref(first)
    del first
    larger = buffers.grown(cache, "dev", 32, lambda n: torch.zeros(n, dtype=torch.int32))
    gc.collect()
    assert larger.numel() == 32 and cache["dev"] is larger
    assert alive() is not None and any(b is alive() for b in buffers.OUTGROWN)  # still there for its graphs


def test_stream_k_counters_grow_without_freeing():
    pytest.importorskip("triton.experimental.gluon")
    from atlas.plugins_trt.quant_linear.gluon_gemm import sk_counter_buffer

    small = sk_counter_buffer(8, "cpu")
    assert small.numel() >= 8 and not small.any()
    big = sk_counter_buffer(small.numel() + 1, "cpu")
    assert big.numel() > small.numel() and not big.any()
    assert any(b is small for b in buffers.OUTGROWN)
    assert sk_counter_buffer(8, "cpu") is big
