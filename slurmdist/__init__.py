"""slurmdist: start torch.distributed correctly, quickly and loudly-when-wrong on HPC clusters.

    import slurmdist
    env = slurmdist.init()      # detect the launcher, pick backend and device, form the process group

`import slurmdist` stays cheap (no torch, mpi4py or submitit): names are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import BackendError, HostlistError, LaunchError, RendezvousError, SlurmdistError

__version__ = "0.1.0"

# Public name -> module that defines it. Loaded lazily so that `import slurmdist` costs microseconds and
# never drags in torch: only `init()` and friends need it.
_LAZY = {
    "DistEnv": "distenv",
    "detect": "detection",
    "torchrun_variables": "exporting",
    "export_env": "exporting",
    "init": "process_group",
    "shutdown": "process_group",
    "initialized": "process_group",
    "is_initialized": "process_group",
    "barrier": "process_group",
    "is_main": "process_group",
    "get_env": "process_group",
    "print0": "logs",
    "RankFilter": "logs",
    "rank_logger": "logs",
    "hostlist": "hostlist",
    "submit": "submit",
    "requeue": "requeue",
}

__all__ = [
    "SlurmdistError",
    "LaunchError",
    "HostlistError",
    "RendezvousError",
    "BackendError",
    *_LAZY,
]


def __getattr__(name: str) -> object:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'slurmdist' has no attribute {name!r}")
    module = importlib.import_module(f".{module_name}", __name__)
    # Submodules are named apart from the functions they hold (detection.detect, not detect.detect), because
    # importing a submodule binds its name on the package and would shadow a function of the same name.
    try:
        value = module if name == module_name else getattr(module, name)
    except AttributeError:
        if name == "shutdown":  # a signal handler's, while init()'s first lookup still loads the module: no
            return _nothing_formed_yet  # group can exist yet (not kept: the real one is there once loaded)
        raise
    globals()[name] = value
    return value


def _nothing_formed_yet() -> None:
    """`shutdown()` before the module that forms groups has finished loading: there is nothing to shut down."""


def __dir__() -> list:
    """The public names, loaded or not, and the module's dunders: not the helpers this file imports for itself
    (importlib, TYPE_CHECKING, annotations), which tab completion would offer."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from . import hostlist, requeue, submit
    from .distenv import DistEnv
    from .detection import detect
    from .exporting import export_env, torchrun_variables
    from .logs import RankFilter, print0, rank_logger
    from .process_group import barrier, get_env, init, initialized, is_initialized, is_main, shutdown
