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


def run_case(runner, batch: int, prompt_len: int, gen_len: int, bandwidth: float, seed: int = 0) -> BenchCase:
    """One measurement: prefill B prompts, then gen_len greedy decode steps; the pool is freed afterwards."""
    c = runner.c
    if prompt_len + gen_len > runner.options.max_seq_len:
        raise ValueError(f"prompt_len + gen_len = {prompt_len + gen_len} exceeds the engine's max_seq_len "
                         f"{runner.options.max_seq_len}")
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, c.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    ids = list(range(batch))
    chunk = runner.options.prefill_chunk
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tokens = []
    for s, p in zip(ids, prompts):
        for i in range(0, prompt_len, chunk):
            first = runner.step(StepBatch((s,), (tuple(p[i:i + chunk]),)))
        tokens.append(first[0])
    torch.cuda.synchronize()
    ttft = time.perf_counter() - t0
    t0 = time.perf_counter()
    # pipelined as a server runs it: step n + 1 is laid out and enqueued while the GPU runs step n, whose
    # tokens the host reads a step late (ModelRunner.decode)
    pending = runner.decode(tuple(ids), tuple(tokens))
    for _ in range(gen_len - 1):
        following = runner.decode(tuple(ids))
        pending.result()
        pending = following
    pending.result()
    torch.cuda.synchronize()
    tpot = (time.perf_counter() - t0) / gen_len
    for s in ids:
        runner.free(s)
    kv_size = runner.kv.layers[0].k.element_size() if runner.kv.layers else 0
    nbytes = weight_bytes(runner.engine.weights, c, batch) + state_bytes(c, batch, prompt_len + gen_len // 2,
                                                                         kv_size)
    floor = nbytes / bandwidth
    return BenchCase(batch, prompt_len, gen_len, ttft, tpot, batch / tpot, nbytes, floor, floor / tpot)


def bench(runner, batch_sizes: list[int], prompt_len: int, gen_len: int, repeats: int = 3) -> dict:
    """Median of `repeats` runs per batch size, with the copy bandwidth measured first."""
    from atlas.tools.bench.timing import copy_bandwidth

    bandwidth = copy_bandwidth()
    cases = []
    for b in batch_sizes:
        runs = [run_case(runner, b, prompt_len, gen_len, bandwidth, seed=r) for r in range(repeats)]
        median = {k: statistics.median(getattr(r, k) for r in runs)
                  for k in ("ttft_s", "tpot_s", "tokens_per_s", "floor_fraction")}
        cases.append({**asdict(runs[0]), **median, "repeats": repeats})
    return {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": bandwidth, "cases": cases}
