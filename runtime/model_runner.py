"""The model runner: owns the GPU work of generation (KV pool, warm-up, CUDA graph capture, steps).

Decode steps (one token a sequence) replay a CUDA graph captured per batch bucket over static step buffers
(runtime/step.StepInputs): the whole step, from the embedding through every layer, the final norm, the LM head
and the argmax. The smallest bucket that holds the batch is replayed; padding sequences write nothing (slot -1,
context length 0). Prefill comes in chunks of at most `prefill_chunk` tokens. The scheduler's choices
(who runs, which tokens) come in as StepBatch; nothing here decides policy.

A prefill chunk of one sequence replays a graph too: one is captured per prefill tier (PREFILL_Q_LENS up to
prefill_chunk, over one static step of that many token rows); a chunk of q tokens replays the smallest tier that holds
it, its rows past q padding in no sequence (StepInputs.build's pad_tokens_to: no KV written, no state touched, every
row independent of the others through the linears and norms). Eager, a 512-token chunk of an 8B model left the GPU
idle for two thirds of its time while the host launched ~450 kernels (tools/results/decode_h100.json,
prefill_profile). Chunks of several sequences, or longer than the last tier, run eagerly.

`decode` pipelines decode steps: each graph also writes its chosen ids into its own input buffer, so a step that
continues the same sequences needs nothing from the host but positions and KV slots (copied from pinned memory,
asynchronously); the host lays out step n + 1 while the GPU runs step n and reads step n's tokens a step late.

`step_shapes` lists every step shape the runner launches, so that the build can record the kernel instances a
runner will ask for (build_engine/step_kernels.py) by running these same steps on meta tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atlas.plugins_trt.attention.splits import ATTN_SPLIT_TOKENS, LEGACY_ATTN_SPLIT_TOKENS, default_num_splits
from atlas.plugins_trt.pdl_order import WAIT_FIRST
from atlas.runtime.block_manager import BlockManager
from atlas.runtime.config import GDN, ModelConfig
from atlas.runtime.cuda_ops import CudaOps
from atlas.runtime.errors import EngineError
from atlas.runtime.kv_cache import KV_DTYPES, KVCache
from atlas.runtime.paged_model import PagedModel
from atlas.runtime.state_pool import StatePool
from atlas.runtime.step import StepBatch, StepInputs

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PREFILL_Q_LENS = (2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 384, 512)
"""Query lengths whose prefill-attention tiles the build compiles (each picks a tile; longer chunks take the last),
and the prefill tiers the runner captures a graph of: a chunk replays the shortest tier that holds it, so the tiers
bound the rows a chunk pads (32, 128, 384: a 65-token chunk took the 256 tier's GEMMs, four times its rows). From 16
tokens on every tier takes the same attention tile (prefill_config), so the longer tiers add graphs, not kernels."""


@dataclass(frozen=True)
class RunnerOptions:
    """Fixed at build (the step kernels are compiled for them) and stored in the manifest."""

    max_batch: int = 32
    block_size: int = 16
    kv_cache_dtype: str = "bfloat16"
    """bfloat16 | fp8 (E4M3, one scale per tensor)."""
    prefill_chunk: int = 512
    max_seq_len: int = 4096
    pdl: bool | int = WAIT_FIRST
    """The step's small kernels compiled and launched with programmatic dependent launch (plugins_trt/pdl.py):
    WAIT_FIRST (the default: each waits for the kernel before it, then lets the next launch), LAUNCH_FIRST (the
    other way round) or False (plain launches)."""
    attn_split_tokens: int = ATTN_SPLIT_TOKENS
    """The decode attention's shortest split of the context, in tokens of max_seq_len (triton_decode.default_num_splits'
    min_split_tokens): fewer make more splits, so more programs a sequence and fewer key tiles each."""

    def __post_init__(self):
        if self.kv_cache_dtype not in ("bfloat16", "fp8"):
            raise ValueError(f"kv_cache_dtype must be bfloat16 or fp8, got {self.kv_cache_dtype!r}")
        if self.max_batch < 1 or self.max_batch > BATCH_BUCKETS[-1]:
            raise ValueError(f"max_batch must be in 1..{BATCH_BUCKETS[-1]}, got {self.max_batch}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be positive, got {self.prefill_chunk}")
        if self.attn_split_tokens < 1:
            raise ValueError(f"attn_split_tokens must be positive, got {self.attn_split_tokens}")

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(b for b in BATCH_BUCKETS if b < self.max_batch) + (
            next(b for b in BATCH_BUCKETS if b >= self.max_batch),)

    @property
    def max_blocks(self) -> int:
        return -(-self.max_seq_len // self.block_size)

    def num_splits(self, config: ModelConfig, bucket: int) -> int:
        """The decode attention's splits over the context for a batch bucket (fixed in its graph)."""
        return default_num_splits(bucket, config.num_kv_heads, self.max_seq_len,
                                  min_split_tokens=self.attn_split_tokens)

    @classmethod
    def from_manifest(cls, options: dict) -> "RunnerOptions":
        """An engine's stored options; one built before attn_split_tokens existed decodes with the splits it was built
        for (LEGACY_ATTN_SPLIT_TOKENS), not today's default."""
        return cls(**{"attn_split_tokens": LEGACY_ATTN_SPLIT_TOKENS, **options})

    def to_dict(self) -> dict:
        return dict(max_batch=self.max_batch, block_size=self.block_size, kv_cache_dtype=self.kv_cache_dtype,
                    prefill_chunk=self.prefill_chunk, max_seq_len=self.max_seq_len, pdl=self.pdl,
                    attn_split_tokens=self.attn_split_tokens)


def prefill_tiers(options: RunnerOptions) -> tuple[int, ...]:
    """The prefill chunk lengths the build compiles for (and the runner captures a graph of), shortest first."""
    longest = min(options.prefill_chunk, options.max_seq_len)
    return tuple(q for q in PREFILL_Q_LENS if q <= longest)


def step_shapes(options: RunnerOptions) -> list[tuple[int, int]]:
    """(sequences, tokens a sequence) of every step the runner launches: the decode buckets, then prefill chunks."""
    return [(b, 1) for b in options.buckets] + [(1, q) for q in prefill_tiers(options)]


def synthetic_step(batch: int, q_len: int, options: RunnerOptions, device) -> StepInputs:
    """A step of `batch` sequences of q_len new tokens each, in a bucket's shape (for capture and recording)."""
    blocks = BlockManager(batch * options.max_blocks, options.block_size)
    return StepInputs.build(StepBatch(tuple(range(batch)), ((0,) * q_len,) * batch), blocks, options.max_blocks,
                            device=device)


@dataclass
class PendingTokens:
    """The tokens of an enqueued decode step: copied to page-locked memory when the GPU gets there."""

    host: torch.Tensor
    done: torch.cuda.Event

    def result(self) -> list[int]:
        self.done.synchronize()
        return self.host.tolist()


class ModelRunner:
    def __init__(self, engine, options: RunnerOptions | None = None, memory_fraction: float = 0.9,
                 num_blocks: int | None = None):
        """engine: a CudaEngine (runtime/cuda_engine.py). num_blocks: the KV pool's size (default: what
        memory_fraction of the free GPU memory holds once the weights are loaded)."""
        c = engine.config
        self.c = c
        self.options = options or RunnerOptions.from_manifest(engine.runtime_options)
        self.engine = engine
        self.ops = CudaOps(c, engine.aot, pdl=self.options.pdl, max_batch=self.options.buckets[-1])
        self.model = PagedModel(c, engine.weights, ops=self.ops, linear=engine.linear)
        o = self.options
        dtype = KV_DTYPES[o.kv_cache_dtype]
        # recurrent state: one slot a running sequence (padding rows carry slot -1 and touch none)
        self.states = StatePool(c, o.buckets[-1], device="cuda") if GDN in c.layer_types else None
        self.slots: dict[int, int] = {}
        """sequence id -> its recurrent-state slot (hybrid models)."""
        attn_layers = sum(kind != GDN for kind in c.layer_types)
        if num_blocks is None:
            free, _ = torch.cuda.mem_get_info()
            per_block = KVCache.bytes_per_token(attn_layers, c.num_kv_heads, c.head_dim, dtype) * o.block_size
            num_blocks = int(free * memory_fraction) // per_block
        if num_blocks < o.max_blocks:
            raise EngineError(f"the KV pool would hold {num_blocks} blocks of {o.block_size} tokens, fewer than one "
                              f"sequence of {o.max_seq_len} tokens needs; free GPU memory, or rebuild the engine "
                              f"with a smaller --max-seq-len")
        scales = [(1.0, 1.0)] * attn_layers if dtype == torch.float8_e4m3fn else None
        self.kv = KVCache.allocate(attn_layers, num_blocks, o.block_size, c.num_kv_heads, c.head_dim, dtype,
                                   device="cuda", scales=scales)
        self.blocks = BlockManager(num_blocks, o.block_size)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, StepInputs, torch.Tensor, torch.Tensor]] = {}
        """decode bucket -> (graph, its static step, its ids, its logits)."""
        self.prefill_graphs: dict[int, tuple[torch.cuda.CUDAGraph, StepInputs, torch.Tensor, torch.Tensor]] = {}
        """prefill tier (token rows of one sequence's chunk) -> (graph, its static step, its ids, its logits)."""
        self._fed: dict[int, tuple[int, ...]] = {}
        """bucket -> the sequences its graph last ran (its input_ids now hold their next tokens)."""
        self.logits: torch.Tensor | None = None
        """fp32 [rows, V]: the last step's logits of each sequence's last token (row i: sequence i; for a replayed
        graph, the graph's own output buffer, overwritten by the next step)."""

    def _forward(self, step: StepInputs, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(greedy next ids [B], logits [B, V]) of a step: the model, then the argmax."""
        self.ops.num_splits = self.options.num_splits(self.c, bucket)
        logits = self.model.forward(step, self.kv, self.states)
        return self.ops.argmax(logits), logits

    def _bucket(self, num_seqs: int) -> int:
        """The smallest batch bucket that holds num_seqs sequences."""
        if num_seqs > self.options.buckets[-1]:
            raise ValueError(f"a step runs at most {self.options.buckets[-1]} sequences (the engine's --max-batch), "
                             f"got {num_seqs}")
        return next(b for b in self.options.buckets if b >= num_seqs)

    def _with_slots(self, batch: StepBatch) -> StepBatch:
        """The batch with its sequences' state slots (a new sequence takes a zeroed one); hybrid models only."""
        if self.states is None:
            return batch
        for s in batch.seq_ids:
            if s not in self.slots:
                self.slots[s] = self.states.acquire()
        return StepBatch(batch.seq_ids, batch.tokens, tuple(self.slots[s] for s in batch.seq_ids))

    def _replay(self, batch: StepBatch, bucket: int, keep_ids: bool) -> torch.Tensor:
        """Lay the decode step out in pinned memory, copy it into the bucket's graph (asynchronously) and replay;
        the graph's ids buffer. The graph leaves its ids in its input_ids, which a `decode` without tokens keeps."""
        graph, static, ids, self.logits = self.graphs[bucket]
        StepInputs.build(batch, self.blocks, self.options.max_blocks, "cpu", pad_to=bucket,
                         pin=True).copy_into(static, keep_ids=keep_ids)
        graph.replay()
        self._fed[bucket] = batch.seq_ids
        return ids

    def step(self, batch: StepBatch) -> list[int]:
        """Run one step (reserving its KV slots); the greedy next token of each sequence.

        Decode steps replay the captured graph of the smallest bucket that holds them, a one-sequence prefill chunk
        the graph of the smallest prefill tier that holds it (eager when none is captured); other steps run eagerly.
        Prefill comes one chunk a call (the caller splits prompts into prefill_chunk tokens).
        """
        q = max(len(t) for t in batch.tokens)
        if q > self.options.prefill_chunk:
            raise ValueError(f"a step brings at most prefill_chunk = {self.options.prefill_chunk} tokens a sequence, "
                             f"got {q}; split the prompt into chunks")
        bucket = self._bucket(len(batch.seq_ids))
        batch = self._with_slots(batch)
        if q == 1 and bucket in self.graphs:
            ids = self._replay(batch, bucket, keep_ids=False)
        elif q > 1 and len(batch.seq_ids) == 1 and (tier := self._prefill_tier(q)) is not None:
            graph, static, ids, self.logits = self.prefill_graphs[tier]
            StepInputs.build(batch, self.blocks, self.options.max_blocks, "cpu", pin=True,
                             pad_tokens_to=tier).copy_into(static)
            graph.replay()
        else:
            step = StepInputs.build(batch, self.blocks, self.options.max_blocks, "cuda")
            ids, self.logits = self._forward(step, bucket)
        return ids[:len(batch.seq_ids)].tolist()

    def _prefill_tier(self, q: int) -> int | None:
        """The shortest captured prefill tier that holds a chunk of q tokens (None: none does)."""
        return min((t for t in self.prefill_graphs if t >= q), default=None)

    def decode(self, seq_ids: tuple[int, ...], tokens: tuple[int, ...] | None = None) -> "PendingTokens":
        """Enqueue one greedy decode step of `seq_ids` without waiting for the GPU; its tokens come from the result.

        tokens: each sequence's input token; None: the tokens the previous decode step of these same sequences
        (same order) chose, which its graph left on the GPU. So a loop of `decode(ids)` never waits for the host:
        the host lays out step n + 1 while the GPU runs step n, and reads step n's tokens a step late (a caller
        that stops a sequence on them runs it one step more, and frees it).
        """
        seq_ids = tuple(seq_ids)
        fed = tokens is None
        bucket = self._bucket(len(seq_ids))
        if bucket not in self.graphs:
            raise ValueError(f"decode needs the captured graph of batch bucket {bucket}; call capture() first")
        if fed and self._fed.get(bucket) != seq_ids:
            raise ValueError(f"decode without tokens continues the last decode step of the same sequences in the "
                             f"same order; bucket {bucket} last ran {self._fed.get(bucket)}, not {seq_ids}")
        # fed: the ids in the step are placeholders, not copied (the graph's own input_ids hold the real ones)
        batch = self._with_slots(StepBatch(seq_ids, tuple((t,) for t in (tokens or (0,) * len(seq_ids)))))
        ids = self._replay(batch, bucket, keep_ids=fed)
        host = torch.empty(len(seq_ids), dtype=ids.dtype, pin_memory=True)
        host.copy_(ids[:len(seq_ids)], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return PendingTokens(host, done)

    def capture(self, buckets: tuple[int, ...] | None = None, prefill: bool = True) -> None:
        """Capture one decode graph per batch bucket (default: all), then (prefill) one graph per prefill tier, the
        longest first, the prefill graphs in one memory pool. Each after a warm-up launch, off the default stream.

        The pool is shared because one prefill runs at a time: a later capture may place its buffers where an
        earlier graph keeps its intermediates, so a prefill graph's outputs (its ids, its logits) hold until the next
        prefill replay, which `step` and `logits` promise anyway (the next step overwrites them)."""
        for bucket in buckets or self.options.buckets:
            self.graphs[bucket] = self._capture(synthetic_step(bucket, 1, self.options, "cuda"), bucket, feed=True)
            self._fed.pop(bucket, None)
        if prefill:
            pool = torch.cuda.graph_pool_handle()
            for tier in sorted(prefill_tiers(self.options), reverse=True):
                self.prefill_graphs[tier] = self._capture(synthetic_step(1, tier, self.options, "cuda"), 1,
                                                          pool=pool)

    def _capture(self, static: StepInputs, bucket: int, feed: bool = False, pool=None):
        """(graph, static, ids, logits) of the step laid out in `static` (feed: the graph also writes its ids into
        its input_ids, the next decode step's input unless the host writes others)."""
        static.slot_mapping.fill_(-1)  # capture writes nothing into the pool (and reads no state: slots are -1)
        static.context_lens.zero_()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(static, bucket)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            ids, logits = self._forward(static, bucket)
            if feed:
                static.input_ids.copy_(ids)
        return graph, static, ids, logits

    def free(self, seq_id: int) -> None:
        """A finished (or preempted) sequence gives back its KV blocks and its state slot."""
        self._fed = {b: ids for b, ids in self._fed.items() if seq_id not in ids}
        self.blocks.free(seq_id)
        if seq_id in self.slots:
            self.states.release(self.slots.pop(seq_id))
