"""Static checks of the sources: names that are used but never defined (pyflakes).

Much of Atlas runs only on the GPU box (the CUDA runtime, benchmarks, dev tools), where a NameError would cost a
device call; this catches it on the CPU."""

from pathlib import Path

from pyflakes import api, messages, reporter

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("build_engine", "runtime", "plugins_trt", "tools", "tests")


class _Collect(reporter.Reporter):
    def __init__(self):
        self.found: list[str] = []

    def flake(self, message):
        if isinstance(message, (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)):
            self.found.append(str(message))

    def syntaxError(self, filename, msg, lineno, offset, text):  # pyflakes.reporter.Reporter's interface
        self.found.append(f"{filename}:{lineno}: syntax error: {msg}")

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")


def test_no_undefined_names():
    collect = _Collect()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            api.checkPath(str(path), collect)
    assert not collect.found, "\n".join(collect.found)
