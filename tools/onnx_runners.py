"""Polygraphy runners for one engine layer type: ONNX Runtime on its graph, and Atlas's reference execution.

Feed dicts hold numpy arrays. Tensors whose ONNX type numpy lacks (bfloat16, float8e4m3fn) travel as
their raw bits (uint16 / uint8); both runners reinterpret them, so both see the same stored weights.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from atlas.plugins_trt.rms_norm.reference import rms_norm
from atlas.plugins_trt.rope.reference import rope_cos_sin, rope_inv_freq
from atlas.runtime.config import ATTENTION, GDN, ModelConfig
from atlas.runtime.engine import materialize
from atlas.runtime.layers.decoder import DecoderLayer
from atlas.runtime.layers.mtp import MTPBlock
from atlas.runtime.state import AttentionState, GDNState

# ONNX type name in the manifest -> (ONNX enum, numpy dtype of the raw bits, torch dtype)
RAW_TYPES = {
    "bfloat16": (TensorProto.BFLOAT16, np.uint16, torch.bfloat16),
    "float8e4m3fn": (TensorProto.FLOAT8E4M3FN, np.uint8, torch.float8_e4m3fn),
}
NUMPY = {"float": np.float32, "int64": np.int64, "uint8": np.uint8}
DECODER_MIXERS = {"decoder_attention": ATTENTION, "decoder_gdn": GDN}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy, bfloat16 / float8 as raw bits."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.float8_e4m3fn:
        return t.contiguous().view(torch.uint8).numpy()
    return t.contiguous().numpy()


def to_torch(a: np.ndarray, onnx_dtype: str) -> torch.Tensor:
    if onnx_dtype in RAW_TYPES:
        return torch.from_numpy(np.ascontiguousarray(a)).view(RAW_TYPES[onnx_dtype][2])
    return torch.from_numpy(np.ascontiguousarray(a))


def _metadata(inputs: list[dict]) -> TensorMetadata:
    meta = TensorMetadata()
    for spec in inputs:
        dtype = RAW_TYPES[spec["dtype"]][1] if spec["dtype"] in RAW_TYPES else NUMPY[spec["dtype"]]
        meta.add(spec["name"], dtype=dtype, shape=[d if isinstance(d, int) else -1 for d in spec["shape"]])
    return meta


class OnnxrtGraphRunner(BaseRunner):
    """ONNX Runtime (CPU) on one layer graph; raw-bit inputs are typed as their ONNX type."""

    def __init__(self, path: Path, fragment: dict, name: str | None = None):
        super().__init__(name=name or f"onnxrt:{Path(path).stem}", prefix="onnxrt-graph-runner")
        self.path = Path(path)
        self.fragment = fragment

    def activate_impl(self):
        self.sess = ort.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])

    def get_input_metadata_impl(self):
        return _metadata(self.fragment["inputs"])

    def infer_impl(self, feed_dict):
        values = {}
        for spec in self.fragment["inputs"]:
            a = np.ascontiguousarray(feed_dict[spec["name"]])
            if spec["dtype"] in RAW_TYPES:
                values[spec["name"]] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, RAW_TYPES[spec["dtype"]][0])
            else:
                values[spec["name"]] = ort.OrtValue.ortvalue_from_numpy(a)
        names = [o["name"] for o in self.fragment["outputs"]]
        start = time.perf_counter()
        outs = self.sess.run_with_ort_values(names, values)
        self.inference_time = time.perf_counter() - start  # Polygraphy reads it after each infer
        return OrderedDict((n, o.numpy()) for n, o in zip(names, outs))

    def deactivate_impl(self):
        del self.sess


class AtlasLayerRunner(BaseRunner):
    """Atlas's runtime execution (the plain-torch reference layers) of one layer type on the same feed."""

    def __init__(self, config: ModelConfig, layer_type: str, fragment: dict, layer_index: int | None = None):
        super().__init__(name=f"atlas:{layer_type}", prefix="atlas-layer-runner")
        self.config = config
        self.layer_type = layer_type
        self.fragment = fragment
        self.layer_index = layer_index
        self.inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, config.rope_scaling)

    def activate_impl(self):
        pass

    def deactivate_impl(self):
        pass

    def get_input_metadata_impl(self):
        return _metadata(self.fragment["inputs"])

    def _weights(self, feed: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        """Canonical-named fp32 weights from the feed (decoder graphs drop the `layers.{i}.` prefix)."""
        stored = {prefix + name: t for name, t in feed.items()}
        formats = {prefix + p: f for p, f in self.fragment["weight_formats"].items()}
        return materialize(stored, formats)

    def infer_impl(self, feed_dict):
        spec = {s["name"]: s["dtype"] for s in self.fragment["inputs"]}
        feed = {n: to_torch(feed_dict[n], spec[n]) for n in spec}
        start = time.perf_counter()
        with torch.inference_mode():
            out = getattr(self, f"_run_{self.layer_type}")(feed)
        self.inference_time = time.perf_counter() - start
        return OrderedDict((o["name"], out[o["name"]].float().numpy()) for o in self.fragment["outputs"])

    def _run_embedding(self, feed):
        w = self._weights(feed, "")
        return {"hidden": w["embed.weight"][feed["token_ids"]]}

    def _head(self, w):
        return w["embed.weight"] if self.config.tie_word_embeddings else w["lm_head.weight"]

    def _run_lm_head(self, feed):
        c = self.config
        w = self._weights(feed, "")
        h = rms_norm(feed["hidden"], w["norm.weight"], c.rms_norm_eps, c.norm_offset)
        return {"logits": h @ self._head(w).T}

    def _run_decoder(self, feed, kind: str):
        prefix = f"layers.{self.layer_index}."
        layer = DecoderLayer(self.config, self._weights(feed, prefix), prefix.rstrip("."), kind)
        hidden = feed["hidden"]
        B, T, _ = hidden.shape
        outs: dict[str, list] = {}
        for b in range(B):
            if kind == ATTENTION:
                past = feed["k_cache"].shape[1]
                k = torch.cat([feed["k_cache"][b], torch.zeros(T, *feed["k_cache"].shape[2:])])
                v = torch.cat([feed["v_cache"][b], torch.zeros(T, *feed["v_cache"].shape[2:])])
                state = AttentionState(k, v)
                cos, sin = rope_cos_sin(feed["positions"][b], self.inv_freq)
                h = layer(hidden[b], state, past, cos, sin)
                parts = {"hidden_out": h, "k_cache_out": state.k, "v_cache_out": state.v}
            else:
                state = GDNState(feed["conv_window"][b].clone(), feed["recurrent_state"][b].clone())
                h = layer(hidden[b], state, 0, None, None)
                parts = {"hidden_out": h, "conv_window_out": state.conv_window,
                         "recurrent_state_out": state.recurrent}
            for name, t in parts.items():
                outs.setdefault(name, []).append(t)
        return {name: torch.stack(ts) for name, ts in outs.items()}

    def _run_decoder_attention(self, feed):
        return self._run_decoder(feed, ATTENTION)

    def _run_decoder_gdn(self, feed):
        return self._run_decoder(feed, GDN)

    def _run_mtp(self, feed):
        c = self.config
        w = self._weights(feed, "")
        block = MTPBlock(c, w)
        B, T, _ = feed["hidden"].shape
        outs: dict[str, list] = {}
        for b in range(B):
            past = feed["k_cache.0"].shape[1]
            states = []
            for j in range(c.mtp_num_layers):
                k, v = feed[f"k_cache.{j}"][b], feed[f"v_cache.{j}"][b]
                states.append(AttentionState(torch.cat([k, torch.zeros(T, *k.shape[1:])]),
                                             torch.cat([v, torch.zeros(T, *v.shape[1:])])))
            cos, sin = rope_cos_sin(feed["positions"][b], self.inv_freq)
            h = block(feed["next_embeds"][b], feed["hidden"][b], states, past, cos, sin)
            parts = {"hidden_out": h, "logits": h @ self._head(w).T}
            for j, s in enumerate(states):
                parts[f"k_cache_out.{j}"], parts[f"v_cache_out.{j}"] = s.k, s.v
            for name, t in parts.items():
                outs.setdefault(name, []).append(t)
        return {name: torch.stack(ts) for name, ts in outs.items()}
