"""Generation on the reference runtime: prompt in, token ids out one at a time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from atlas.plugins_trt.sampling.reference import sample
from atlas.runtime.engine import Engine, load_engine
from atlas.runtime.errors import RequestError
from atlas.runtime.model import Model
from atlas.runtime.tokenizer import EngineTokenizer


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0
    """0 is greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 keeps every token."""
    seed: int | None = None

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}.")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise RequestError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}.")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k!r}.")


class Generator:
    """An engine loaded for generation: model, tokenizer (when the engine has one), limits.

    A CPU engine runs the reference model; an engine built for cuda runs on the GPU through the model runner
    (paged KV, the decode step replayed from its CUDA graph), one sequence at a time.
    """

    def __init__(self, engine: Engine, prefill_graphs: bool = True):
        """prefill_graphs (GPU engines): replay one-sequence prefill chunks from CUDA graphs (ModelRunner.capture);
        False runs them eagerly, as atlas-run's --eager-prefill (less capture time and graph memory, a longer TTFT)."""
        self.engine = engine
        self.config = engine.config
        self.runner = None
        if engine.manifest.get("target", {}).get("device") == "cuda":
            from atlas.runtime.model_runner import ModelRunner

            self.runner = ModelRunner(engine)
            self.runner.capture(buckets=(1,), prefill=prefill_graphs)
        else:
            self.model = Model(engine.config, engine.weights)
        self.tokenizer = EngineTokenizer(engine.path) if engine.has_tokenizer else None
        self.max_seq_len = engine.max_seq_len
        eos = engine.generation_defaults.get("eos_token_ids") or list(engine.config.eos_token_ids)
        self.eos_ids = set(eos)

    @classmethod
    def load(cls, path: str | Path, verify_checksums: bool = True, prefill_graphs: bool = True) -> "Generator":
        from atlas.runtime.engine import read_manifest

        if read_manifest(Path(path)).get("target", {}).get("device") == "cuda":
            from atlas.runtime.cuda_engine import load_cuda_engine

            return cls(load_cuda_engine(path, verify_checksums=verify_checksums), prefill_graphs=prefill_graphs)
        return cls(load_engine(path, verify_checksums=verify_checksums))

    def check_ids(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise RequestError("the prompt is empty; give at least one token.")
        bad = [t for t in token_ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise RequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.config.vocab_size}).")
        if len(token_ids) >= self.max_seq_len:
            raise RequestError(
                f"the prompt has {len(token_ids)} tokens, but this engine serves at most {self.max_seq_len} "
                f"(prompt + generated). Shorten the prompt, or rebuild with a larger --max-seq-len "
                f"(up to the model's {self.config.max_position_embeddings})."
            )

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[int]:
        """Yield generated ids until an EOS id (not yielded), max_tokens, or the engine's max_seq_len."""
        self.check_ids(prompt_ids)
        limit = min(params.max_tokens, self.max_seq_len - len(prompt_ids))
        if self.runner is not None:
            yield from self._generate_cuda(prompt_ids, params, limit)
            return
        state = self.model.new_state(len(prompt_ids) + limit)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        logits = self.model.forward(torch.tensor(prompt_ids), state).logits[-1]
        for i in range(limit):
            token = sample(logits, params.temperature, params.top_k, params.top_p, generator)
            if token in self.eos_ids:
                return
            yield token
            if i + 1 < limit:
                logits = self.model.forward(torch.tensor([token]), state).logits[-1]

    def _generate_cuda(self, prompt_ids: list[int], params: SamplingParams, limit: int) -> Iterator[int]:
        """The GPU loop: the prompt in prefill chunks, then one decode step a token; the sequence's KV blocks and
        state slot are given back however the loop ends."""
        from atlas.runtime.step import StepBatch

        runner, seq = self.runner, 0
        generator = torch.Generator(device="cuda").manual_seed(params.seed) if params.seed is not None else None
        chunk = runner.options.prefill_chunk
        try:
            for i in range(0, len(prompt_ids), chunk):
                ids = runner.step(StepBatch((seq,), (tuple(prompt_ids[i:i + chunk]),)))
            if params.temperature == 0:
                yield from self._greedy_pipelined(seq, ids[0], limit)
                return
            for i in range(limit):
                token = sample(runner.logits[0], params.temperature, params.top_k, params.top_p, generator)
                if token in self.eos_ids:
                    return
                yield token
                if i + 1 < limit:
                    runner.step(StepBatch((seq,), ((token,),)))  # its logits: runner.logits
        finally:
            runner.free(seq)

    def _greedy_pipelined(self, seq: int, first: int, limit: int) -> Iterator[int]:
        """Greedy decode with ModelRunner.decode: the step that makes token i + 1 is enqueued before token i is
        handed out, so the GPU never waits for the host (after an EOS, one step more has run and is dropped)."""
        runner, token, pending = self.runner, first, None
        for i in range(limit):
            following = runner.decode((seq,), None if pending else (token,)) if i + 1 < limit else None
            if pending is not None:
                token = pending.result()[0]
            if token in self.eos_ids:
                return
            yield token
            pending = following

    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """fp32 logits [T, vocab] of every position, from one forward over the tokens."""
        if self.runner is not None:
            raise RequestError("logits of every position come from a CPU engine (the GPU runner keeps only each "
                               "sequence's last); build one with atlas-build --device cpu")
        self.check_ids(token_ids)
        state = self.model.new_state(len(token_ids))
        return self.model.forward(torch.tensor(token_ids), state).logits
