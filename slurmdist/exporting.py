"""torchrun's variable names for a detected topology, for libraries and scripts that read them."""

from __future__ import annotations

import os
from collections import abc
from typing import Dict, MutableMapping, Optional

from .distenv import DistEnv, require_distenv
from .errors import SlurmdistError


def torchrun_variables(env: DistEnv) -> Dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (+ GROUP_RANK/GROUP_WORLD_SIZE).

    Master address and port are left out when not yet known (MPI across nodes before `init()`).
    """
    require_distenv(env)
    variables = {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
    }
    if env.node_rank is not None:
        variables["GROUP_RANK"] = str(env.node_rank)
    if env.num_nodes is not None:
        variables["GROUP_WORLD_SIZE"] = str(env.num_nodes)
    if env.master_addr is not None:
        variables["MASTER_ADDR"] = env.master_addr
    if env.master_port is not None:
        variables["MASTER_PORT"] = str(env.master_port)
    return variables


def export_env(env: DistEnv, environ: Optional[MutableMapping[str, str]] = None) -> Dict[str, str]:
    """Set torchrun's variables in `environ` (default `os.environ`); returns what was set. A single process
    gets a free port, as `init_process_group()` over env:// needs one even then.

    A master name is exported as an address every rank resolves: the name where DNS has it, else Slurm's
    NodeAddr for it (a lookup, bounded). A launch whose master is not known yet is an error (an MPI launch across nodes, or MPICH's and the other
    PMI launchers' even on one node, agrees on rank 0's address and port at the rendezvous): a library reading
    the variables would fail later, far from the cause. `torchrun_variables()` gives the ranks alone.

    Besides this call, made only when asked, slurmdist writes two variables, each only when unset: `init()`
    sets gloo's GLOO_SOCKET_IFNAME (see slurmdist.interfaces), and Open MPI's OMPI_MCA_btl for its own MPI_Init
    across nodes (see slurmdist.mpi_share).
    """
    target = os.environ if environ is None else environ
    require_distenv(env)
    if not isinstance(target, abc.MutableMapping):
        raise TypeError(f"environ={environ!r} must be a mapping to set the variables in, such as os.environ")
    if env.world_size > 1 and (env.master_addr is None or env.master_port is None):
        missing = " and ".join(name for name, value in (("MASTER_ADDR", env.master_addr),
                                                        ("MASTER_PORT", env.master_port)) if value is None)
        raise SlurmdistError(
            f"export_env(): this {env.launcher} launch gives no {missing} yet (an MPI launch agrees on rank 0's "
            "address and port at the rendezvous, over mpi4py): export what init() returns, "
            "export_env(slurmdist.init()), or resolve it first, export_env(slurmdist.rendezvous.resolve_master(env)) "
            "on every rank; torchrun_variables(env) gives the ranks alone"
        )
    if env.world_size == 1 and env.master_port is None:  # env:// wants a port even for one process
        from .hosts import free_port

        env = env.replace(master_port=free_port())
    from .interfaces import ip_of

    if env.world_size > 1 and env.master_addr is not None and ip_of(env.master_addr) is None:
        # A library's env:// start dials MASTER_ADDR from every rank, and cannot fall back to Slurm's NodeAddr
        # as init() does: the ranks init() left on the master's node hold its name, which may not be in DNS.
        from .hosts import resolve_host

        env = env.replace(master_addr=resolve_host(env.master_addr, os.environ))
    variables = torchrun_variables(env)
    target.update(variables)
    return variables
