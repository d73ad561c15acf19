"""Prefill then token-by-token decode (and chunked prefill) give the logits of one full forward."""

import pytest
import torch

from atlas.runtime.engine import load_engine
from atlas.runtime.model import Model
from conftest import PARITY_FAMILIES


def _walk(model: Model, ids: list[int], chunks: list[int]) -> torch.Tensor:
    state = model.new_state(len(ids))
    rows, pos = [], 0
    for n in chunks:
        rows.append(model.forward(torch.tensor(ids[pos:pos + n]), state).logits)
        pos += n
    assert state.length == len(ids)
    return torch.cat(rows)


@pytest.mark.parametrize("family", PARITY_FAMILIES)
def test_prefill_then_decode_equals_full_forward(family, tiny_engine, prompt_ids):
    engine = load_engine(tiny_engine(family))
    model = Model(engine.config, engine.weights)
    full = _walk(model, prompt_ids, [len(prompt_ids)])
    stepwise = _walk(model, prompt_ids, [40] + [1] * 24)
    chunked = _walk(model, prompt_ids, [17, 5, 30, 12])
    for other in (stepwise, chunked):
        err = float((other - full).norm() / full.norm())
        assert err < 1e-5, err


def test_state_capacity_is_enforced(tiny_engine, prompt_ids):
    engine = load_engine(tiny_engine("llama"))
    model = Model(engine.config, engine.weights)
    state = model.new_state(8)
    with pytest.raises(ValueError, match="capacity"):
        model.forward(torch.tensor(prompt_ids[:9]), state)
