"""Where tensors go: the one home of the device default and of the device checks.

Every helper that makes tensors takes ``device=None`` and passes it through
:func:`resolve_device`, so a name torch does not know (``"gpu"``) or a CUDA device on a machine
without one fails at the call, with the argument named, instead of deep inside torch.
:func:`default_device` is the device a helper uses when the caller names none: the GPU where
there is one.
"""

from __future__ import annotations

import torch

__all__ = ["default_device", "resolve_device"]


def default_device() -> torch.device:
    """``cuda`` (the current GPU) on a machine with a CUDA GPU, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device, *, default: bool = False, name: str = "device") -> torch.device | None:
    """``device`` as a ``torch.device``; ``None`` stays ``None`` (or becomes
    :func:`default_device` with ``default=True``).

    Raises ``ValueError`` naming ``name`` for a string torch does not know (``"gpu"``) and for a
    CUDA device on a machine without CUDA; ``TypeError`` for anything that is not a device.
    """
    if device is None:
        return default_device() if default else None
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(
            f"{name}={device!r}: must be a torch.device or a name such as 'cpu' or 'cuda', "
            f"not {type(device).__name__}"
        )
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ValueError(
            f"{name}={device!r}: not a torch device, such as 'cpu' or 'cuda' ({error})"
        ) from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r}: this machine has no CUDA GPU")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"{name}={device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)"
            )
    elif resolved.type not in ("cpu", "meta"):
        raise ValueError(
            f"{name}={device!r}: fp8lab runs on 'cpu' or 'cuda', not {resolved.type!r}"
        )
    return resolved
