"""Device, precision and thread set-up for curvature work (docs/numerics.md#threads)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import nn

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class DropoutActiveError(RuntimeError, ValueError):
    """A stochastic layer would be active while curvature is measured (a ``ValueError``
    too: it is bad input, named like the engine's other input errors)."""


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` → CUDA when present, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but no CUDA device is available")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise ValueError(f"device: expected auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def resolve_dtype(name: str = "float32") -> torch.dtype:
    """``float32`` (default) or ``float64``; half precisions are refused
    (docs/numerics.md#precision)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"precision: expected float32 or float64, got {name!r}") from None


def configure_cuda_for_curvature() -> None:
    """TF32 off: curvature needs full fp32 matmuls (docs/numerics.md#precision)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@functools.cache
def _blas_controller():
    """The process's threadpoolctl controller, made once (None without threadpoolctl ≥ 3):
    finding the loaded BLAS libraries reads ``/proc/self/maps`` and took about 1 ms a call,
    more than the small eigenproblem it guarded."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


@contextlib.contextmanager
def pinned_blas_threads(n_threads: int = 1) -> Iterator[None]:
    """Pin BLAS threads around scipy calls (docs/numerics.md#threads): threadpoolctl when installed
    (its controller is made once a process, so the BLAS libraries loaded then, numpy's among
    them, are the ones pinned), else torch's intra-op thread count is pinned and restored."""
    controller = _blas_controller()
    if controller is not None:
        with controller.limit(limits=n_threads):
            yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def active_dropouts(model: nn.Module) -> list[str]:
    """Names of dropout-like modules that would be active (training mode and p > 0)."""
    found = []
    for name, module in model.named_modules():
        p = getattr(module, "p", None)
        is_dropout = (
            isinstance(module, nn.modules.dropout._DropoutNd) or "Dropout" in type(module).__name__
        )
        if is_dropout and module.training and (p is None or p > 0):
            found.append(name or type(module).__name__)
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            found.append(name or type(module).__name__)
    return found


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """The engine's one guard around every curvature computation: eval mode, no stochastic
    layer active, attention on the MATH backend (fused SDPA kernels have no second derivative),
    and every submodule's own mode restored on exit (docs/numerics.md#eval-mode: never
    silently flip the caller's mode)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        active = active_dropouts(model)
        if active:
            raise DropoutActiveError(
                f"model: stochastic layers still active in eval mode: {', '.join(active)}"
            )
        with _math_sdpa():
            yield model
    finally:
        for module, training in modes:
            module.training = training


@contextlib.contextmanager
def _math_sdpa() -> Iterator[None]:
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - old torch
        yield
        return
    with sdpa_kernel(SDPBackend.MATH):
        yield
