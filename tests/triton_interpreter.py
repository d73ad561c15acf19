"""Fixes to Triton 3.6's CPU interpreter shared by the kernel tests (imported from tests/, which conftest puts on
sys.path). Each is applied once per process, whichever test module asks first."""

from __future__ import annotations


def fix_interpreter_index() -> None:
    """Triton 3.6's interpreter turns a scalar into an int with int(ndarray of shape (1,)), which numpy >= 2.4
    refuses, so `for t in range(T)` over a kernel int argument fails; index element 0."""
    from triton.runtime import interpreter
    orig = interpreter._patch_lang_tensor
    if getattr(orig, "atlas_index_fix", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.atlas_index_fix = True
    interpreter._patch_lang_tensor = patched
