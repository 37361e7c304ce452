"""Worker the integration tests launch: init, one all_reduce, one JSON line on stdout.

`python allreduce.py [slurmdist|plain] [BACKEND]`: `plain` is torch's own env:// start, for comparison.
With ALLREDUCE_TWICE=1 a slurmdist rank also shuts down and forms the group a second time; rank 0 first
sleeps RANK0_LINGER seconds, if set, so the others reach its port while its first store still serves.
With INIT_RETRIES=N a slurmdist rank calls init() again, up to N more times, after a RendezvousError.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import slurmdist

from exiting import exit_with  # a sibling module: the worker runs as a script from this directory


def init_with_retries(backend: str) -> slurmdist.DistEnv:
    retries = int(os.environ.get("INIT_RETRIES", "0"))
    for attempt in range(retries + 1):
        try:
            return slurmdist.init(backend)
        except slurmdist.RendezvousError as exc:
            if attempt == retries:
                raise
            print(f"attempt {attempt} failed, retrying: {exc}", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "slurmdist"
    started, wall_start = time.monotonic(), time.time()
    if mode == "plain":  # the node numbering as torchrun's variables carry it (`slurmdist run` sets them)
        dist.init_process_group("gloo")
        rank, world, launcher = dist.get_rank(), dist.get_world_size(), "plain"
        nodes = [os.environ.get("GROUP_RANK"), os.environ.get("GROUP_WORLD_SIZE")]
    else:
        env = init_with_retries(sys.argv[2] if len(sys.argv) > 2 else "auto")
        rank, world, launcher = env.rank, env.world_size, env.launcher
        nodes = [env.node_rank, env.num_nodes]
    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor)
    elapsed = time.monotonic() - started
    record = {
        "rank": rank,
        "world_size": world,
        "launcher": launcher,
        "sum": tensor.item(),
        "expected": world * (world + 1) / 2,
        "seconds": round(elapsed, 4),
        "start": wall_start,
        "end": wall_start + elapsed,
        "host": os.uname().nodename,
        "node": [None if n is None else int(n) for n in nodes],  # [node rank, number of nodes]
        "gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME"),
        "master_addr": os.environ.get("MASTER_ADDR"),  # what a torchrun-style start was told
    }
    if mode != "plain" and os.environ.get("ALLREDUCE_TWICE") == "1":
        if rank == 0:
            time.sleep(float(os.environ.get("RANK0_LINGER", "0")))
        slurmdist.shutdown()
        record["gloo_interface_after_shutdown"] = os.environ.get("GLOO_SOCKET_IFNAME")
        slurmdist.init(sys.argv[2] if len(sys.argv) > 2 else "auto")
        again = torch.tensor([float(rank + 1)])
        dist.all_reduce(again)
        record["sum_again"] = again.item()
        record["gloo_interface_again"] = os.environ.get("GLOO_SOCKET_IFNAME")
    print(json.dumps(record), flush=True)
    if mode == "plain":
        dist.destroy_process_group()
    return 0 if tensor.item() == record["expected"] else 1


if __name__ == "__main__":
    exit_with(main())
