"""Which storage format each canonical tensor gets: one dtype for the model, overridable per class.

Classes: embed, attn, gdn, mlp, lm_head, mtp. Quantized formats apply to linear weights only
(`*_proj.weight`, `lm_head.weight`, `mtp.fc.weight`), and by default not to the LM head; the embedding
and other matrices (the GDN conv) stay in the float base dtype; vectors (norms, A_log, dt_bias, biases)
are always float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atlas.build_engine.errors import BuildError

FLOAT_FORMATS = ("float32", "bfloat16")
QUANT_FORMATS = ("fp8", "fp8_block", "nvfp4")
FORMATS = FLOAT_FORMATS + QUANT_FORMATS
CLASSES = ("embed", "attn", "gdn", "mlp", "lm_head", "mtp")


def tensor_class(name: str) -> str | None:
    """The precision class of a canonical linear weight or the embedding; None for everything else."""
    if name == "embed.weight":
        return "embed"
    linear = name.endswith("_proj.weight") or name in ("lm_head.weight", "mtp.fc.weight")
    if not linear:
        return None
    if name.startswith("mtp."):
        return "mtp"
    if name == "lm_head.weight":
        return "lm_head"
    for cls in ("attn", "gdn", "mlp"):
        if f".{cls}." in name:
            return cls
    return None


@dataclass
class PrecisionPlan:
    dtype: str = "float32"
    """The model's format: float32 | bfloat16 | fp8 | fp8_block | nvfp4."""
    overrides: dict[str, str] = field(default_factory=dict)
    """class -> format, e.g. {"lm_head": "bfloat16"}."""

    def __post_init__(self):
        if self.dtype not in FORMATS:
            raise BuildError(f"--dtype must be one of {', '.join(FORMATS)}; got '{self.dtype}'.")
        for cls, fmt in self.overrides.items():
            if cls not in CLASSES:
                raise BuildError(f"unknown layer class '{cls}' in --class-dtype; classes: {', '.join(CLASSES)}.")
            if fmt not in FORMATS:
                raise BuildError(f"--class-dtype {cls}={fmt}: the format must be one of {', '.join(FORMATS)}.")
            if cls == "embed" and fmt not in FLOAT_FORMATS:
                raise BuildError(
                    f"--class-dtype embed={fmt}: the embedding is a table lookup and can be stored as "
                    f"{' or '.join(FLOAT_FORMATS)} only."
                )

    @property
    def float_base(self) -> str:
        """Dtype of matrices that are not quantized (embedding, GDN conv): bfloat16 under a quantized model."""
        return self.dtype if self.dtype in FLOAT_FORMATS else "bfloat16"

    def format_of(self, name: str, ndim: int) -> str:
        """Storage format of canonical tensor `name` of `ndim` dims."""
        if ndim < 2:
            return "float32"
        cls = tensor_class(name)
        if cls is None:
            return self.float_base
        if cls in self.overrides:
            return self.overrides[cls]
        # The embedding is a lookup table; the LM head stays in the float base by default, as ModelOpt's
        # FP8 / NVFP4 recipes leave it (quantize it with --class-dtype lm_head=<format>).
        return self.float_base if cls in ("embed", "lm_head") else self.dtype


def parse_class_dtypes(items: tuple[str, ...]) -> dict[str, str]:
    """['lm_head=bfloat16', 'embed=float32'] -> {"lm_head": "bfloat16", "embed": "float32"}."""
    out = {}
    for item in items:
        cls, sep, fmt = item.partition("=")
        if not sep or not cls or not fmt:
            raise BuildError(f"--class-dtype expects CLASS=FORMAT (e.g. lm_head=bfloat16), got '{item}'.")
        out[cls.strip()] = fmt.strip()
    return out
