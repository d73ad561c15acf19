"""Shared fixtures: tiny HF checkpoints per family, engines built from them, the default model's engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from hf_tiny import make_checkpoint  # noqa: E402

PARITY_FAMILIES = ["llama", "llama_tied", "qwen3", "qwen3_next", "qwen3_5"]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """family -> path of a tiny random transformers checkpoint (made once per session)."""
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = make_checkpoint(family, tmp_path_factory.mktemp(f"ckpt-{family}"))
        return made[family]

    return get


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory, tiny_checkpoint):
    """family -> path of an fp32 engine built from tiny_checkpoint(family)."""
    from atlas.build_engine.builder import BuildConfig, build

    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            out = tmp_path_factory.mktemp(f"engine-{family}") / "engine"
            built[family] = build(BuildConfig(str(tiny_checkpoint(family)), out, progress=False)).path
        return built[family]

    return get


@pytest.fixture(scope="session")
def smollm2_engine(tmp_path_factory):
    """The embedded default model (SmolLM2-135M-Instruct from its GGUF) built as an fp32 engine."""
    from atlas.build_engine.builder import BuildConfig, build

    out = tmp_path_factory.mktemp("smollm2") / "engine"
    return build(BuildConfig(None, out, max_seq_len=2048, progress=False)).path


@pytest.fixture
def prompt_ids():
    """64 fresh random token ids inside the tiny vocabulary."""
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, 384, (64,), generator=g).tolist()
