"""`atlas-run bench`: decode speed of a GPU engine against its memory-bandwidth floor.

For each batch size B: B random prompts of prompt_len tokens are prefilled (in chunks, eagerly: TTFT is the time to
the first token of every sequence), then gen_len decode steps replay the batch's CUDA graph (TPOT: time a step),
pipelined (ModelRunner.decode: the host lays out a step while the GPU runs the one before).
The floor of a decode step is the bytes it must read, over the copy bandwidth measured in the same run:
every weight once (the embedding only for its B rows unless it is also the LM head), the KV cache of every
attention layer at the step's context, and the recurrent state of every Gated DeltaNet layer read and written.
floor_fraction = floor time / TPOT. Each figure is the median over `repeats` runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from atlas.runtime.config import GDN, ModelConfig
from atlas.runtime.step import StepBatch


@dataclass
class BenchCase:
    batch: int
    prompt_len: int
    gen_len: int
    ttft_s: float
    """Prefill of the whole batch to its first tokens."""
    tpot_s: float
    """One decode step (every sequence one token)."""
    tokens_per_s: float
    """Decode tokens a second over the batch: batch / tpot."""
    bytes_per_step: int
    floor_s: float
    floor_fraction: float


def weight_bytes(weights: dict[str, torch.Tensor], config: ModelConfig, batch: int) -> int:
    """Bytes of weights one decode step reads (a gathered embedding reads only its batch rows)."""
    total = sum(t.numel() * t.element_size() for n, t in weights.items() if n != "embed.weight")
    embed = weights["embed.weight"]
    if config.tie_word_embeddings:
        return total + embed.numel() * embed.element_size()
    return total + batch * embed.shape[1] * embed.element_size()


def state_bytes(config: ModelConfig, batch: int, context: int, kv_element_size: int) -> int:
    """KV bytes read at `context` tokens a sequence, plus recurrent state read and written, over the batch."""
    c = config
    attn = sum(k != GDN for k in c.layer_types)
    gdn = c.num_layers - attn
    kv = attn * 2 * context * c.num_kv_heads * c.head_dim * kv_element_size
    state = gdn * 2 * 4 * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
    return batch * (kv + state)


def _prompts(runner, batch: int, prompt_len: int, gen_len: int, seed: int) -> list[list[int]]:
    """B random prompts of prompt_len tokens (room checked for gen_len more)."""
    if prompt_len + gen_len > runner.options.max_seq_len:
        raise ValueError(f"prompt_len + gen_len = {prompt_len + gen_len} exceeds the engine's max_seq_len "
                         f"{runner.options.max_seq_len}")
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, runner.c.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(batch)]


def _prefill(runner, prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """The prompts prefilled in chunks as sequences 0 .. B-1: (sequence ids, first tokens)."""
    ids = list(range(len(prompts)))
    chunk = runner.options.prefill_chunk
    tokens = []
    for s, p in zip(ids, prompts):
        for i in range(0, len(p), chunk):
            first = runner.step(StepBatch((s,), (tuple(p[i:i + chunk]),)))
        tokens.append(first[0])
    return ids, tokens


def _decode(runner, ids: list[int], tokens: list[int] | None, steps: int) -> None:
    """`steps` greedy decode steps, pipelined as a server runs them: step n + 1 is laid out and enqueued while the
    GPU runs step n, whose tokens the host reads a step late (ModelRunner.decode). tokens None: continue the last
    decode of the same sequences."""
    pending = runner.decode(tuple(ids), None if tokens is None else tuple(tokens))
    for _ in range(steps - 1):
        following = runner.decode(tuple(ids))
        pending.result()
        pending = following
    pending.result()


def run_case(runner, batch: int, prompt_len: int, gen_len: int, bandwidth: float, seed: int = 0) -> BenchCase:
    """One measurement: prefill B prompts, then gen_len greedy decode steps; the pool is freed afterwards."""
    c = runner.c
    prompts = _prompts(runner, batch, prompt_len, gen_len, seed)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ids, tokens = _prefill(runner, prompts)
    torch.cuda.synchronize()
    ttft = time.perf_counter() - t0
    t0 = time.perf_counter()
    _decode(runner, ids, tokens, gen_len)
    torch.cuda.synchronize()
    tpot = (time.perf_counter() - t0) / gen_len
    for s in ids:
        runner.free(s)
    kv_size = runner.kv.layers[0].k.element_size() if runner.kv.layers else 0
    nbytes = weight_bytes(runner.engine.weights, c, batch) + state_bytes(c, batch, prompt_len + gen_len // 2,
                                                                         kv_size)
    floor = nbytes / bandwidth
    return BenchCase(batch, prompt_len, gen_len, ttft, tpot, batch / tpot, nbytes, floor, floor / tpot)


def kernel_table(kernels: list[tuple], steps: int, wall_s: float) -> dict:
    """Per-step figures from (name, start us, end us[, grid]) of every GPU activity over `steps` decode steps that
    took wall_s: each name's launches and microseconds a step (largest first), their sum, the step's wall time, and
    the GPU's idle share (the gaps between kernels that neither the graph nor programmatic dependent launch hid).
    Where the events carry their grids, "by_grid" has the same figures for each (name, grid): one kernel at one
    shape, so that a linear's share in the step can be told from another's of the same kernel.

    A kernel's microseconds are its own share of the timeline: from the end of what finished before it (or its
    start, if later) to its end. Under programmatic dependent launch a kernel starts while its predecessor runs and
    waits for it, so its duration ("resident_us") counts its predecessor's time too; the shares add up to the busy
    time instead, and say what a step would save if the kernel took no time."""
    by_name: dict[str, list[tuple[float, float]]] = {}
    by_grid: dict[tuple[str, tuple], list[tuple[float, float]]] = {}
    done = float("-inf")  # the latest end so far (one stream: kernels finish in order)
    for name, start, end, *grid in sorted(kernels, key=lambda e: (e[2], e[1])):
        # C++ signatures (cuBLAS) and copies ("Memcpy HtoD (Pinned -> Device)") cut at "("
        short = name.split("(")[0].removeprefix("void ").strip()[:90]
        share = (max(0.0, end - max(start, done)), end - start)
        by_name.setdefault(short, []).append(share)
        if grid and grid[0] is not None:
            by_grid.setdefault((short, tuple(grid[0])), []).append(share)
        done = max(done, end)

    def rows(groups: dict, label) -> list[dict]:
        return sorted(({**label(k), "launches": len(v) / steps, "us": sum(u for u, _ in v) / steps,
                        "resident_us": sum(r for _, r in v) / steps} for k, v in groups.items()),
                      key=lambda r: -r["us"])

    table = rows(by_name, lambda n: {"name": n})
    busy = sum(r["us"] for r in table)
    step_us = wall_s / steps * 1e6
    out = {"steps": steps, "step_us": step_us, "kernel_us": busy, "idle_fraction": max(0.0, 1 - busy / step_us),
           "kernels": table}
    if by_grid:
        out["by_grid"] = rows(by_grid, lambda k: {"name": k[0], "grid": list(k[1])})
    return out


def trace_kernels(trace: dict) -> list[tuple[str, float, float, list | None]]:
    """(name, start us, end us, grid or None) of the GPU activities (kernels, copies, memsets) in a torch.profiler
    Chrome trace (`export_chrome_trace`'s JSON): the grid of each kernel, which the profiler's events lack."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            start = float(e["ts"])
            out.append((e["name"], start, start + float(e.get("dur", 0.0)), (e.get("args") or {}).get("grid")))
    return out


def _profiled(run) -> tuple[list[tuple], float]:
    """run() under torch.profiler (CUDA activities only): its GPU activities (name, start us, end us[, grid]) and
    its wall seconds (synchronized)."""
    import json
    import tempfile

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    try:  # the activities with their grids, from the Chrome trace
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            events = trace_kernels(json.loads(Path(f.name).read_text()))
    except (OSError, ValueError, KeyError):
        events = []
    if not events:  # a trace without them: the profiler's events (no grids, so no by_grid)
        events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == DeviceType.CUDA]
    return events, wall


def kernel_profile(runner, batch: int, prompt_len: int, steps: int = 32, seed: int = 0) -> dict:
    """Where a decode step's time goes: `steps` pipelined decode steps of `batch` sequences after a prompt_len
    prefill, under torch.profiler (CUDA activities only: the kernels inside the graph replays, and the copies),
    summed a step by kernel_table, by kernel and (from the profiler's Chrome trace, where it has them) by kernel and
    grid. The profiler's own cost shows in step_us, not in the kernels' times. A profiler that fails gives
    {"error": ...} (the caller's bench figures stand)."""
    ids, tokens = _prefill(runner, _prompts(runner, batch, prompt_len, steps + 2, seed))
    try:
        _decode(runner, ids, tokens, 2)  # warm-up: the profile sees continuing steps only
        events, wall = _profiled(lambda: _decode(runner, ids, None, steps))
    except RuntimeError as e:
        return {"batch": batch, "prompt_len": prompt_len, "error": f"{type(e).__name__}: {e}"}
    finally:
        for s in ids:
            runner.free(s)
    return {"batch": batch, "prompt_len": prompt_len, **kernel_table(events, steps, wall)}


def prefill_profile(runner, prompt_len: int, repeats: int = 5, seed: int = 0) -> dict:
    """Where a batch-1 prefill's time (the TTFT) goes: `repeats` plain timings of one prompt_len prefill (their
    spread: "ttft_ms"), then one more under the profiler, by kernel_table with the whole prefill as its one step.
    With prefill graphs captured (ModelRunner.capture), also `repeats` timings without them ("eager_ttft_ms": the
    chunks launched kernel by kernel from the host, as before the graphs). idle_fraction is the share of the TTFT
    the GPU waited for the host. A profiler that fails gives {"error": ...}."""
    def prefill(r: int) -> None:
        _prefill(runner, _prompts(runner, 1, prompt_len, 2, seed + r))

    def timed() -> list[float]:
        times = []
        for r in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prefill(r)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            runner.free(0)
        return times

    out = {"prompt_len": prompt_len, "ttft_ms": timed()}
    if runner.prefill_graphs:
        graphs, runner.prefill_graphs = runner.prefill_graphs, {}
        try:
            out["eager_ttft_ms"] = timed()
        finally:
            runner.prefill_graphs = graphs
    try:
        events, wall = _profiled(lambda: prefill(repeats))
        runner.free(0)
    except RuntimeError as e:
        return {**out, "error": f"{type(e).__name__}: {e}"}
    return {**out, **kernel_table(events, 1, wall)}


def profile_text(p: dict, rows: int = 15) -> str:
    """kernel_profile's table as text: the largest kernels a step, then the sum and the idle share."""
    if "error" in p:
        return f"no kernel profile at batch {p['batch']}: {p['error']}"
    lines = [f"decode step at batch {p['batch']} under the profiler: {p['step_us']:.0f} us, kernels "
             f"{p['kernel_us']:.0f} us, GPU idle {p['idle_fraction']:.1%}",
             f"{'us/step':>9} {'resident':>9} {'launches':>8}  kernel  (us: its own share of the step; resident: "
             f"from its start, waits on the kernel before it included)"]
    lines += [f"{r['us']:>9.1f} {r.get('resident_us', r['us']):>9.1f} {r['launches']:>8.1f}  {r['name']}"
              for r in p["kernels"][:rows]]
    if len(p["kernels"]) > rows:
        rest = p["kernels"][rows:]
        lines.append(f"{sum(r['us'] for r in rest):>9.1f} {sum(r.get('resident_us', r['us']) for r in rest):>9.1f} "
                     f"{sum(r['launches'] for r in rest):>8.1f}  ({len(rest)} more kernels)")
    if p.get("by_grid"):
        lines.append(f"{'us/step':>9} {'us/launch':>9} {'launches':>8}  kernel [grid]  (the largest {rows} by grid)")
        lines += [f"{r['us']:>9.1f} {r['us'] / r['launches']:>9.1f} {r['launches']:>8.1f}  {r['name']} {r['grid']}"
                  for r in p["by_grid"][:rows]]
    return "\n".join(lines)


def bench(runner, batch_sizes: list[int], prompt_len: int, gen_len: int, repeats: int = 3) -> dict:
    """Median of `repeats` runs per batch size, with the copy bandwidth measured first."""
    from atlas.tools.bench.timing import copy_bandwidth

    # the runner's KV pool took 90% of the free memory: the copy takes what is left (up to 4 GiB, at least 256 MiB)
    free = torch.cuda.mem_get_info()[0]
    nbytes = min(4 * 2**30, (free * 3 // 4) // 2**20 * 2**20)
    if nbytes < 2**28:
        raise ValueError(f"only {free / 2**20:.0f} MiB of GPU memory is free after the engine, its KV pool and its "
                         f"graphs: too little to measure the copy bandwidth; free the memory other processes hold on "
                         f"this GPU and run bench again")
    bandwidth = copy_bandwidth(nbytes)
    cases = []
    for b in batch_sizes:
        runs = [run_case(runner, b, prompt_len, gen_len, bandwidth, seed=r) for r in range(repeats)]
        median = {k: statistics.median(getattr(r, k) for r in runs)
                  for k in ("ttft_s", "tpot_s", "tokens_per_s", "floor_fraction")}
        cases.append({**asdict(runs[0]), **median, "repeats": repeats})
    return {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": bandwidth, "cases": cases}
