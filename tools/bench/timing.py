"""GPU timing helpers shared by the benchmarks: copy bandwidth, and medians of CUDA-graph replays.

Every timed region is captured once in a CUDA graph and replayed; launch overhead stays out of kernel
figures. Work whose bytes fit in L2 rotates over enough copies of its inputs that each replay reads
from device memory (H200: 60 MB of L2; `copies_for` keeps the rotation above 4x that).
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import torch

L2_BYTES = 60 * 2**20


def copies_for(bytes_per_call: int, floor_bytes: int = 4 * L2_BYTES, most: int = 64) -> int:
    return max(1, min(most, math.ceil(floor_bytes / max(bytes_per_call, 1))))


def graph_time(calls: list[Callable[[], None]], repeats: int = 30, warmup: int = 3) -> float:
    """Median seconds per call of `calls` (run in order) captured in one CUDA graph and replayed."""
    return paired_graph_times([calls], repeats, warmup)[0]


def _captured(calls: list[Callable[[], None]], warmup: int) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def paired_graph_times(call_lists: list[list[Callable[[], None]]], repeats: int = 30, warmup: int = 3) -> list[float]:
    """graph_time of each list of calls, their replays interleaved (round r replays every graph once, in order), so
    that every figure is taken over the same stretch of time: the same clocks and temperature. A comparison of two
    kernels timed minutes apart drifts with the GPU's state (in tools/results/gemm_h100.json the M 2048 winners' final
    figures came out 3-12% slower than their own search timings taken minutes before, cuBLAS having been timed
    before the search), so the benchmark's final figures of a kernel and of cuBLAS beside it are taken this way."""
    graphs = [_captured(calls, warmup) for calls in call_lists]
    times = [[] for _ in graphs]
    for _ in range(repeats):
        for graph, ts in zip(graphs, times):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end) / 1e3)
    return [statistics.median(ts) / len(calls) for ts, calls in zip(times, call_lists)]


def copy_bandwidth(nbytes: int = 4 * 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written.

    The best of two copies of nbytes / 2: `copy_` (a memcpy node in the graph, which the driver may hand
    to a copy engine) and an elementwise kernel on the SMs (`neg` on float32), the path kernels take."""
    def best() -> float:  # its buffers are freed on return
        src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda").normal_()
        dst = torch.empty_like(src)
        return min(graph_time([lambda: dst.copy_(src)], repeats=20),
                   graph_time([lambda: torch.neg(src, out=dst)], repeats=20))

    t = best()
    torch.cuda.empty_cache()
    return nbytes / t


def device_info() -> dict:
    import platform

    import triton

    props = torch.cuda.get_device_properties(0)
    return {"device": props.name, "sm_count": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "python": platform.python_version()}
