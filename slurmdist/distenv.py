"""`DistEnv`: who this process is in a distributed job, as one immutable value."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from .errors import LaunchError

# Where a launch that stays on this machine meets (one node, or a single process).
LOOPBACK = "127.0.0.1"

LAUNCHERS = (
    "torchrun",
    "deepspeed",
    "slurm",
    "openmpi",
    "pmi",
    "mvapich",
    "pals",
    "flux",
    "jsrun",
    "submitit-local",
    "single",
)


@dataclass(frozen=True)
class DistEnv:
    """The topology of one process, as a launcher described it.

    `node_rank` and `num_nodes` are None only where the launcher gives no way to know them (MPI launchers
    across several nodes, until `init()` shares the master over mpi4py and numbers the nodes from the ranks'
    host names); `master_addr`/`master_port` are None where they are resolved at `init()` time.
    `device`, `device_ids` and `backend` are filled in by `slurmdist.init()`.
    """

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: Optional[int]
    num_nodes: Optional[int]
    master_addr: Optional[str]
    master_port: Optional[int]
    job_id: Optional[str]
    device: Any = dataclasses.field(default=None, compare=False)
    device_ids: Optional[Tuple[int, ...]] = None
    backend: Optional[str] = None

    def __post_init__(self) -> None:
        check_topology(self)

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that logs, saves and hosts the rendezvous store."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """True on local rank 0: the process that should download or unpack per-node data."""
        return self.local_rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def master_endpoint(self) -> Tuple[str, int]:
        """`(master_addr, master_port)` where the code needs both (after `resolve_master()` filled them)."""
        if self.master_addr is None or self.master_port is None:
            if self.world_size == 1:
                raise LaunchError(f"{self.launcher}: a single process (world size 1) has no master port: init() forms "
                                  "its group without a rendezvous. Check env.world_size > 1 first, or call "
                                  "slurmdist.rendezvous.resolve_master(env), which picks a free port")
            raise LaunchError(f"{self.launcher}: the master address and port are not resolved yet "
                              f"({self.master_addr}:{self.master_port}): resolve them first with "
                              "slurmdist.rendezvous.resolve_master(env) (init() does)")
        return self.master_addr, self.master_port

    def replace(self, **changes: Any) -> "DistEnv":
        """A copy with some fields changed (the value itself is frozen)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """Plain, JSON-ready fields (the torch device as its string form)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["device"] = None if self.device is None else str(self.device)
        fields["device_ids"] = None if self.device_ids is None else list(self.device_ids)
        fields["is_main"] = self.is_main
        return fields


# The fields that hold counts and positions: ints (not bools, floats or strings), None only where optional.
_WHOLE_FIELDS = {"rank": False, "local_rank": False, "world_size": False, "local_world_size": False,
                 "node_rank": True, "num_nodes": True, "master_port": True}


def require_distenv(env: object) -> DistEnv:
    """`env` itself when it is a DistEnv; else a TypeError that says what was expected."""
    if not isinstance(env, DistEnv):
        raise TypeError(f"expected the DistEnv that slurmdist.detect() or slurmdist.init() returned, got {env!r}")
    return env


def check_topology(env: DistEnv) -> None:
    """Reject a topology that cannot be true, naming the launcher whose variables said so."""
    for name, optional in _WHOLE_FIELDS.items():  # env.replace(world_size=2.0) from code: a TypeError, said so
        value = getattr(env, name)
        if type(value) is not int and not (optional and value is None):
            raise TypeError(f"DistEnv.{name}={value!r} must be an int{' or None' if optional else ''}")
    if env.launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {env.launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    pairs = [
        ("rank", env.rank, "world_size", env.world_size),
        ("local_rank", env.local_rank, "local_world_size", env.local_world_size),
    ]
    if env.node_rank is not None and env.num_nodes is not None:
        pairs.append(("node_rank", env.node_rank, "num_nodes", env.num_nodes))
    for index_name, index, size_name, size in pairs:
        if size < 1:
            raise LaunchError(f"{env.launcher}: {size_name}={size} must be at least 1")
        if not 0 <= index < size:
            raise LaunchError(
                f"{env.launcher}: {index_name}={index} is outside 0..{size - 1} ({size_name}={size}); "
                "the launcher variables contradict each other: relaunch, or unset stale variables "
                "left over from an outer job"
            )
    if env.local_world_size > env.world_size:
        raise LaunchError(
            f"{env.launcher}: local_world_size={env.local_world_size} exceeds world_size={env.world_size}; "
            "the launcher variables contradict each other"
        )
    check_every_node_runs_one(env.launcher, env.node_rank, env.num_nodes, env.local_world_size, env.world_size)
    if env.master_port is not None and not 0 < env.master_port < 65536:
        raise LaunchError(f"{env.launcher}: master port {env.master_port} is outside 1..65535")


def check_every_node_runs_one(launcher: str, node_rank: Optional[int], num_nodes: Optional[int], local_world_size: int,
                              world_size: int, names: Tuple[str, str, str, str] = (
                                  "node_rank", "num_nodes", "local_world_size", "world_size")) -> None:
    """Every node of a launch runs one process at least: the nodes besides this one (all of them when their
    count is known, else those before it) and this node's processes cannot outnumber the world. `names` are
    what the message calls the four values (a launcher passes its variables' names)."""
    others = num_nodes - 1 if num_nodes is not None else node_rank
    if others is None or others + local_world_size <= world_size:
        return
    node_name, nodes_name, local_name, world_name = names
    told = (f"{nodes_name}={num_nodes} puts {others} other node(s) beside" if num_nodes is not None
            else f"{node_name}={node_rank} puts {others} node(s) before")
    raise LaunchError(
        f"{launcher}: {told} this one, each running one process at least, besides the "
        f"{local_name}={local_world_size} on this node: more than {world_name}={world_size}. The launcher "
        "variables contradict each other: relaunch, or unset stale variables left over from an outer job",
        nodes_name if num_nodes is not None else node_name, str(num_nodes if num_nodes is not None else node_rank),
    )
