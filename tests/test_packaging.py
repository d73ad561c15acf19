"""Every package folder is listed in pyproject.toml, so a non-editable install carries it."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = project["package-dir"]
    listed = set(project["packages"])
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            module = ".".join([name, *rel.parts]) if rel.parts else name
            if "__pycache__" not in module:
                assert module in listed, f"{module} ({init.parent}) is missing from pyproject's packages"
