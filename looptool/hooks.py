"""Hooks: how a lower layer reaches a feature that a higher layer provides.

`Tensor.numpy()` (frontend) must compile and run, and `LoopTree.check()` (schedule)
must ask the isl analysis; both live in layers above the class that offers the
convenience.  Rather than importing upward, the lower layer declares a `Hook` and
the higher layer installs its implementation when it is imported (`import
looptool` imports every layer, so the hooks are always installed for users).
"""
from __future__ import annotations


class Hook:
    """A named slot for an implementation that a higher layer installs."""

    def __init__(self, what: str, provider: str):
        self.what, self.provider = what, provider
        self._impl = None

    def install(self, impl) -> None:
        """Provide the implementation (called once, by the providing layer at import)."""
        self._impl = impl

    def get(self):
        """The installed implementation, or a clear error naming the module that provides it."""
        if self._impl is None:
            raise RuntimeError(f"{self.what} is provided by {self.provider}, which is not imported; "
                               f"import looptool first")
        return self._impl
