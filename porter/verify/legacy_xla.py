"""Run an original written for an older torch_xla on the installed one.

Scripts that are already on torch_xla but on names removed since (``xm.xrt_world_size``,
``xm.get_ordinal``, ...) cannot run as they are on torch_xla 2.9, so there would be no
reference run to compare their port with. ``install()`` puts the removed names back as the
thin aliases they were in torch_xla 2.6 (each forwarded to its ``torch_xla.runtime``
successor), for the original's side only. The port must not need them: its side never
installs this.
"""
from __future__ import annotations

ALIASES = {
    # torch_xla.core.xla_model name: torch_xla.runtime successor
    "xrt_world_size": "world_size",
    "get_ordinal": "global_ordinal",
    "get_local_ordinal": "local_ordinal",
}


def install() -> list[str]:
    """Add the missing aliases; returns the names added."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    added = []
    for old, new in ALIASES.items():
        if not hasattr(xm, old):
            target = getattr(xr, new)

            def alias(*args, _target=target, **kwargs):
                return _target()

            alias.__name__ = old
            setattr(xm, old, alias)
            added.append(old)
    return added
