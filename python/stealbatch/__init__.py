"""stealbatch for PyTorch users: a work-stealing runtime for data-parallel training on unevenly loaded devices.

    import stealbatch as sb
    rt = sb.Runtime(model, devices="cpu:2", optimizer="adam", lr=3e-3)
    def loss_fn(replica, x, y):                       # a summed loss: the runtime divides by the batch
        return F.cross_entropy(replica(x), y, reduction="sum")
    for batch in batches:                              # each a tensor of sample ids
        report = rt.step(batch, loss_fn, data=(X, Y))  # the exact full-batch gradient, then the update
    rt.copy_to(model)                                  # the trained values into your module

Each device trains a replica of the module whose parameters and gradients are views of the runtime's own buffers;
idle devices steal chunks of the batch from busy ones; the gradient is the full batch's whichever device ran which
chunk.
"""
import ctypes as _ctypes

# Open MPI loads its components with dlopen and expects libmpi's symbols to be global; a Python extension is loaded
# with RTLD_LOCAL. Loading libmpi globally first (as mpi4py does) lets cluster="mpi" work; without MPI nothing happens.
for _name in ("libmpi.so.40", "libmpi.so"):
    try:
        _ctypes.CDLL(_name, mode=_ctypes.RTLD_GLOBAL)
        break
    except OSError:
        pass

# torch before the extension: both need NCCL and cuBLAS (one libnccl.so.2 per process), and torch's own, which it
# loads from its wheel, are the newer; the extension binds to whichever is loaded first.
import torch  # noqa: E402,F401  (loaded for its libraries)

from . import _core  # noqa: E402
from ._core import ChunkError, CheckpointError, ConfigError, DataError, Error, StepReport, TimeoutError  # noqa: E402,A004
from ._runtime import Runtime, launch_environment  # noqa: E402

has_cuda = _core.has_cuda
has_mpi = _core.has_mpi

__all__ = ["Runtime", "StepReport", "Error", "ConfigError", "DataError", "CheckpointError", "ChunkError", "TimeoutError",
           "launch_environment", "has_cuda", "has_mpi"]
