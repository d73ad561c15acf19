"""Recurrent-state pool of the Gated DeltaNet layers: one slot per running sequence (the hybrid models' "SSM" state).

Layout (what plugins_trt/gated_delta_net/triton_recurrent.py and causal_conv1d/triton_conv.py read and write):
  window of one layer: [num_slots, C, KW-1], the last KW-1 conv inputs of each slot (activation dtype);
  state of one layer:  [num_slots, HV, DK, DV], the delta-rule state S of each slot (fp32).
A sequence keeps its slot from its first prefill chunk to its end; `acquire` zeroes the slot (a fresh sequence
starts from S = 0 and a zero window).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atlas.runtime.config import GDN, ModelConfig


class OutOfSlots(RuntimeError):
    """Every state slot is held; the scheduler must wait for a sequence to finish."""


@dataclass
class LayerState:
    window: torch.Tensor
    """[num_slots, C, KW-1]."""
    state: torch.Tensor
    """[num_slots, HV, DK, DV] fp32."""


class StatePool:
    def __init__(self, config: ModelConfig, num_slots: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu"):
        c = config
        self.layers: dict[int, LayerState] = {
            i: LayerState(
                torch.zeros(num_slots, c.gdn_conv_size, c.linear_conv_kernel - 1, dtype=dtype, device=device),
                torch.zeros(num_slots, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                            dtype=torch.float32, device=device))
            for i, kind in enumerate(c.layer_types) if kind == GDN}
        """decoder layer index -> its windows and states."""
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @staticmethod
    def bytes_per_slot(config: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> int:
        c = config
        n = sum(kind == GDN for kind in c.layer_types)
        window = c.gdn_conv_size * (c.linear_conv_kernel - 1) * torch.empty((), dtype=dtype).element_size()
        state = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
        return n * (window + state)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        """A zeroed slot for a new sequence."""
        if not self._free:
            raise OutOfSlots(f"all {self.num_slots} recurrent-state slots are held")
        slot = self._free.pop()
        for layer in self.layers.values():
            layer.window[slot].zero_()
            layer.state[slot].zero_()
        return slot

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise ValueError(f"state slot {slot} is not held")
        self._free.append(slot)
