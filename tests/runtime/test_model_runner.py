"""The GPU model runner (runtime/model_runner.py) on engines built for cuda: graph replay equals eager execution,
and the batched GPU steps follow the fp32 CPU reference of the same checkpoint.

CPU part: the runner's options and step shapes. The rest needs the GPU (`gpu` marker)."""

from __future__ import annotations

import pytest
import torch

from atlas.runtime.model_runner import BATCH_BUCKETS, RunnerOptions, step_shapes

PRESETS = ["tiny-llama", "tiny-qwen3", "tiny-qwen3.5"]  # tiny-qwen3.5: Gated DeltaNet layers beside attention


def test_buckets_cover_max_batch():
    assert RunnerOptions(max_batch=32).buckets == (1, 2, 4, 8, 16, 32)
    assert RunnerOptions(max_batch=20).buckets == (1, 2, 4, 8, 16, 32)
    assert RunnerOptions(max_batch=1).buckets == (1,)
    with pytest.raises(ValueError, match="max_batch"):
        RunnerOptions(max_batch=BATCH_BUCKETS[-1] + 1)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        RunnerOptions(kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="attn_split_tokens"):
        RunnerOptions(attn_split_tokens=0)


def test_attention_splits_follow_the_shortest_split():
    """RunnerOptions.attn_split_tokens sets the decode attention's splits a bucket (default_num_splits: at most the
    context over it, at most ~two waves of programs), and travels with the options (the manifest's step_kernels)."""
    from types import SimpleNamespace

    c = SimpleNamespace(num_kv_heads=8)  # Llama-3.1-8B's; the splits read nothing else of the model
    o = RunnerOptions(max_seq_len=832)
    assert o.attn_split_tokens == 64 and [o.num_splits(c, b) for b in (1, 8, 32)] == [13, 5, 2]
    long = RunnerOptions(max_seq_len=832, attn_split_tokens=256)
    assert [long.num_splits(c, b) for b in (1, 8, 32)] == [4, 4, 2]
    assert RunnerOptions.from_manifest(long.to_dict()) == long and RunnerOptions.from_manifest(o.to_dict()) == o
    older = RunnerOptions.from_manifest({k: v for k, v in o.to_dict().items() if k != "attn_split_tokens"})
    assert older == long  # built before the option: the 256-token splits its graphs were captured for


def test_step_shapes_list_decode_buckets_then_prefill_chunks():
    shapes = step_shapes(RunnerOptions(max_batch=4, prefill_chunk=64))
    assert shapes[:3] == [(1, 1), (2, 1), (4, 1)]
    assert all(b == 1 and 1 < q <= 64 for b, q in shapes[3:])
    assert (1, 64) in shapes


@pytest.fixture(scope="module", params=[(p, kv) for p in PRESETS for kv in ("bfloat16", "fp8")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def gpu_engine(request, tmp_path_factory):
    from atlas.build_engine.builder import BuildConfig, build
    preset, kv = request.param
    out = tmp_path_factory.mktemp(preset) / "e"
    # max_seq_len 1024: every decode bucket splits the context (4 ways), the splits combined in the same launch
    build(BuildConfig(f"synthetic:{preset}", out, dtype="bfloat16", device="cuda", autotune=False, onnx=False,
                      kv_cache_dtype=kv, max_batch=4, max_seq_len=1024, progress=False))
    cpu = tmp_path_factory.mktemp(preset + "-cpu") / "e"
    build(BuildConfig(f"synthetic:{preset}", cpu, onnx=False, max_seq_len=256, progress=False))
    return out, cpu, kv


def _prompts(vocab: int, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (n,), generator=g).tolist()) for n in lens]


@pytest.mark.gpu
def test_graph_replay_equals_eager(gpu_engine):
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner
    from atlas.runtime.step import StepBatch

    path, _, _ = gpu_engine
    engine = load_cuda_engine(path)
    prompts = _prompts(engine.config.vocab_size, [5, 17, 33])
    results = []
    for way in ("eager", "graphs", "pipelined"):
        runner = ModelRunner(engine, num_blocks=64)
        if way != "eager":
            runner.capture()
        ids = runner.step(StepBatch((0, 1, 2), prompts))  # one prefill step of three prompts
        seqs = [[i] for i in ids]
        if way == "pipelined":  # decode(): the graph feeds its own ids forward, the host reads them a step late
            pending = runner.decode((0, 1, 2), tuple(ids))
            for _ in range(11):
                following = runner.decode((0, 1, 2))
                for s, i in zip(seqs, pending.result()):
                    s.append(i)
                pending = following
            for s, i in zip(seqs, pending.result()):
                s.append(i)
        else:
            for _ in range(12):  # decode: bucket 4 for three sequences (one padding row)
                ids = runner.step(StepBatch((0, 1, 2), tuple((s[-1],) for s in seqs)))
                for s, i in zip(seqs, ids):
                    s.append(i)
        results.append(seqs)
    assert results[0] == results[1] == results[2]


@pytest.mark.gpu
def test_prefill_graphs_equal_eager(gpu_engine):
    """A one-sequence prefill chunk replays its tier's graph: the logits are bit for bit the eager step laid out over
    the same padded rows (the same kernels), and within bf16 noise of the unpadded eager step (other M, so other
    GEMM kernels), as is the KV it writes. Chunk lengths hit every kind of tier: exact (5, 16), padded (11 -> 16,
    40 -> 64, 100 -> 128, 300 -> 384), and a second chunk over the first's KV (and state). Three runners, each its
    own pools."""
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner, prefill_tiers
    from atlas.runtime.step import StepBatch, StepInputs

    path, _, _ = gpu_engine
    engine = load_cuda_engine(path)
    graphs, padded, eager = (ModelRunner(engine, num_blocks=64) for _ in range(3))
    graphs.capture()
    eager.capture(prefill=False)
    assert tuple(sorted(graphs.prefill_graphs)) == prefill_tiers(graphs.options) and not eager.prefill_graphs
    worst = 0.0
    for seq, lens in enumerate([(5,), (16,), (11,), (40,), (100,), (300,), (11, 40)]):
        prompt = _prompts(engine.config.vocab_size, [sum(lens)], seed=seq)[0]
        done = 0
        for n in lens:
            batch = StepBatch((seq,), (prompt[done:done + n],))
            done += n
            tier = min(t for t in graphs.prefill_graphs if t >= n)
            got = graphs.step(batch)
            step = StepInputs.build(padded._with_slots(batch), padded.blocks, padded.options.max_blocks, "cuda",
                                    pad_tokens_to=tier)
            assert torch.equal(graphs.logits[:1], padded._forward(step, 1)[1][:1]), \
                f"chunk {n} (tier {tier}): the graph differs from the eager step over the same rows"
            want = eager.step(batch)
            ref = eager.logits[0]
            err = ((graphs.logits[0] - ref).norm() / ref.norm()).item()
            worst = max(worst, err)
            assert err < 2e-2, f"chunk {n} (tier {tier}): padded logits off by {err:.2e}"
            assert ref[want[0]] - ref[got[0]] <= 2e-2 * ref.abs().max()  # the same token, or a near tie
        for r in (graphs, padded, eager):
            r.free(seq)
    for a, b in zip(graphs.kv.layers, eager.kv.layers):  # the same blocks handed out in the same order
        assert ((a.k.float() - b.k.float()).norm() / b.k.float().norm()).item() < 2e-2
    print(f"padded against unpadded prefill logits: worst error ratio {worst:.1e}")


@pytest.mark.gpu
def test_generator_with_eager_prefill_answers_alike(gpu_engine):
    """atlas-run's --eager-prefill (Generator(prefill_graphs=False)): no prefill graph captured, and the same greedy
    tokens as the generator that replays them where a chunk fills its tier exactly (5, 16, 64, 128 tokens: the same
    kernels at the same M, so the same bits; a padded chunk's logits differ in bf16 noise, see
    test_prefill_graphs_equal_eager); a padded prompt (37 -> 64) generates too."""
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.generator import Generator, SamplingParams

    path, _, _ = gpu_engine
    engine = load_cuda_engine(path)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    # the first generator's KV pool takes most of the free GPU memory, the second most of what is left
    with_graphs, eager = Generator(engine), Generator(engine, prefill_graphs=False)
    with_graphs.eos_ids = eager.eos_ids = set()  # random weights: no early stop, all 8 tokens compared
    assert with_graphs.runner.prefill_graphs and not eager.runner.prefill_graphs
    for seed, n in enumerate((5, 16, 64, 128)):
        assert n in with_graphs.runner.prefill_graphs
        prompt = list(_prompts(engine.config.vocab_size, [n], seed=seed)[0])
        got = list(with_graphs.generate(prompt, params))
        assert len(got) == 8 and got == list(eager.generate(prompt, params)), f"prompt of {n}"
    padded = list(_prompts(engine.config.vocab_size, [37], seed=9)[0])
    assert len(list(with_graphs.generate(padded, params))) == 8
    del with_graphs, eager  # their memory back for the tests after
    import gc
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_decode_without_tokens_continues_only_the_same_sequences(gpu_engine):
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner
    from atlas.runtime.step import StepBatch

    path, _, _ = gpu_engine
    runner = ModelRunner(load_cuda_engine(path), num_blocks=64)
    runner.capture()
    prompts = _prompts(runner.c.vocab_size, [5, 7])
    ids = runner.step(StepBatch((0, 1), prompts))
    with pytest.raises(ValueError, match="continues the last decode step"):
        runner.decode((0, 1))  # no decode step ran yet
    runner.decode((0, 1), tuple(ids)).result()
    with pytest.raises(ValueError, match="continues the last decode step"):
        runner.decode((1, 0))  # another order
    runner.free(1)
    with pytest.raises(ValueError, match="continues the last decode step"):
        runner.decode((0, 1))  # a freed sequence
    assert len(runner.decode((0,), (ids[0],)).result()) == 1


def _prefill(runner, prompts, chunk: int | None) -> list[int]:
    """Prefill prompts (sequence ids 0, 1, ..) whole, or `chunk` tokens a step (the sequences with tokens left run
    together; each later chunk continues from the KV cache and, for hybrid models, its state slot); returns the
    next token of each prompt."""
    from atlas.runtime.step import StepBatch

    chunk = chunk or max(map(len, prompts))
    done, nxt = [0] * len(prompts), [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        seqs = tuple(i for i, p in enumerate(prompts) if done[i] < len(p))
        tokens = tuple(prompts[i][done[i]:done[i] + chunk] for i in seqs)
        for i, t, new in zip(seqs, runner.step(StepBatch(seqs, tokens)), tokens):
            done[i] += len(new)
            nxt[i] = t
    return nxt


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [None, 4], ids=["whole-prompts", "prompts-in-chunks-of-4"])
def test_gpu_steps_follow_the_cpu_reference(gpu_engine, chunk):
    """Greedy continuations: each GPU token must be the CPU reference's argmax, or within bf16 noise of it."""
    path, cpu_path, kv = gpu_engine
    _follow_the_cpu_reference(path, cpu_path, chunk, tol=0.05 if kv == "bfloat16" else 0.15)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [None, 4], ids=["whole-prompts", "prompts-in-chunks-of-4"])
def test_padded_nvfp4_hybrid_follows_the_cpu_engine(chunk, tmp_path_factory):
    """tiny-qwen3.5-wide in nvfp4: its GDN in_proj and attention qkv run padded to whole tiles, their outputs read
    as views by the GDN kernels and qkv_rope (prefill and decode); the GPU steps follow the CPU engine of the same
    quantized weights."""
    from atlas.build_engine.builder import BuildConfig, build

    built = {device: build(BuildConfig("synthetic:tiny-qwen3.5-wide", tmp_path_factory.mktemp(f"wide-{device}") / "e",
                                       dtype="nvfp4", device=device, autotune=False, onnx=False, max_batch=4,
                                       max_seq_len=1024, progress=False))
             for device in ("cuda", "cpu")}
    plan = built["cuda"].manifest["linear_kernels"]
    assert {key for key, entry in plan.items() if entry["1"].get("pad_n")} == {"nvfp4:200x128", "nvfp4:320x128"}
    _follow_the_cpu_reference(built["cuda"].path, built["cpu"].path, chunk, tol=0.05)


def _follow_the_cpu_reference(path, cpu_path, chunk, tol):
    """Two prompts prefilled (whole or in chunks) on the GPU engine at path, then ten greedy steps: each GPU token
    within tol x the largest |logit| of the CPU reference's best, the reference fed the GPU's tokens."""
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.engine import load_engine
    from atlas.runtime.model import Model
    from atlas.runtime.model_runner import ModelRunner
    from atlas.runtime.step import StepBatch

    runner = ModelRunner(load_cuda_engine(path), num_blocks=64)
    runner.capture()
    cpu = load_engine(cpu_path)
    ref = Model(cpu.config, cpu.weights)
    prompts = _prompts(cpu.config.vocab_size, [9, 4], seed=1)
    ids = _prefill(runner, prompts, chunk)
    states = [ref.new_state(64) for _ in prompts]
    logits = [ref.forward(torch.tensor(p), s).logits[-1] for p, s in zip(prompts, states)]
    for step in range(10):
        for i, l in zip(ids, logits):
            assert l.max() - l[i] <= tol * l.abs().max(), f"step {step}: token {i} is far from the reference argmax"
        logits = [ref.forward(torch.tensor([i]), s).logits[-1] for i, s in zip(ids, states)]
        ids = runner.step(StepBatch((0, 1), tuple((i,) for i in ids)))


@pytest.mark.gpu
def test_greedy_generation_is_the_step_by_step_greedy_sequence(gpu_engine):
    """Generator's pipelined greedy loop (ModelRunner.decode) gives the tokens of plain runner steps, stops at
    max_tokens, and gives every KV block back, also when the caller stops reading early."""
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.generator import Generator, SamplingParams
    from atlas.runtime.model_runner import ModelRunner
    from atlas.runtime.step import StepBatch

    path, _, _ = gpu_engine
    gen = Generator.load(path)
    gen.eos_ids = set()  # random weights: no early stop, so that all 12 tokens are compared
    prompt = list(_prompts(gen.config.vocab_size, [11], seed=3)[0])
    got = list(gen.generate(prompt, SamplingParams(max_tokens=12, temperature=0)))
    runner = ModelRunner(load_cuda_engine(path), num_blocks=64)
    runner.capture()
    want = runner.step(StepBatch((0,), (tuple(prompt),)))
    for _ in range(11):
        want += runner.step(StepBatch((0,), ((want[-1],),)))
    assert got == want
    assert gen.runner.blocks.num_free == gen.runner.blocks.num_blocks
    stream = gen.generate(prompt, SamplingParams(max_tokens=12, temperature=0))
    assert [next(stream) for _ in range(3)] == want[:3]
    stream.close()
    assert gen.runner.blocks.num_free == gen.runner.blocks.num_blocks
    del gen, runner  # the generator's KV pool took most of the GPU's memory
    import gc
    gc.collect()
    torch.cuda.empty_cache()
