"""The process's table of modules scripted here (register_torchscript_module, targets/torchscript.hpp)."""
from . import _nmcmc as _C


class KeptModule:
    """A module kept in this process's table under its key ("memory:N"); its bytes are dropped when
    no Target or Model made from it holds this object any more."""

    def __init__(self, key: str):
        self.key = key

    def __del__(self):
        try:
            _C.release_module(self.key)
        except Exception:  # the interpreter is shutting down
            pass
