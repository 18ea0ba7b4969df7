"""Note [OpenBLAS's kernels] before LibTorch loads: the program's own rule, no child process."""
import os as _os
import sys as _sys


def choose_kernels() -> None:
    """Note [OpenBLAS's kernels] (apps/process/nmcmc/process/blas_kernels.hpp): a DYNAMIC_ARCH
    OpenBLAS picks its kernels when it loads, and falls back to SSE3 ones ("Prescott") on a CPU
    model newer than itself, running every GEMM ~3x slower. Only OPENBLAS_CORETYPE, read when the
    library loads, overrides that: so before LibTorch (and its OpenBLAS) loads here, the program's
    own rule (the small library _blas_choice, no LibTorch in it) probes the kernels OpenBLAS would
    take and, where they are its SSE-only fallback and this CPU runs AVX or wider, the variable is
    set for this process (it is how OpenBLAS is told). No child process. Nothing is done where
    torch is already imported (too late: `nmcmc.blas_kernels()` says so) or where the user set
    OPENBLAS_CORETYPE."""
    if "torch" in _sys.modules or _os.environ.get("OPENBLAS_CORETYPE"):
        return
    try:
        import ctypes
        rule = ctypes.CDLL(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_blas_choice.so"))
        rule.nmcmc_blas_choice.restype = ctypes.c_char_p
        choice = rule.nmcmc_blas_choice().decode()
    except (OSError, AttributeError):  # no rule library beside the package: leave OpenBLAS as it is
        return
    if choice:
        best, loaded = choice.split("\t")
        _os.environ["OPENBLAS_CORETYPE"] = best
        _os.environ["NMCMC_BLAS_CORE_FROM"] = loaded
