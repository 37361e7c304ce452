"""Many lightweight ranks in one process: what slurmdist's rendezvous adds over torch's store, at scale.

`python store_clients.py HOST PORT PREFIX WORLD FIRST LAST WORKERS CONNECTIONS` simulates ranks FIRST..LAST-1
against a store served elsewhere, over CONNECTIONS TCPStore clients shared round-robin (every rank's
operations still reach the server one by one; only the number of sockets is smaller, because opening a
client here stalls for 5 s about once in 30: torch's client makes a reverse DNS lookup of the store's address,
and this machine's DNS server leaves some queries unanswered). Phase by phase with the other worker processes (a barrier on
the store between phases), it runs for each of its ranks:

- baseline: what any store-based start needs, one `add` to a counter and one `wait` for a "go" key;
- slurmdist: `current_keys()` and `Rendezvous.check_in()`, then `Rendezvous.wait_all()`, the real code `init()` runs;
- the failure path once: with every 8th rank absent, one rank's `Rendezvous.fail()` names the missing ones.

Prints one JSON line of seconds per phase. Standalone script, so it can be started from anywhere.
"""

import json
import sys
import time
from datetime import timedelta


def barrier(store, name: str, parties: int, timeout: float = 300.0) -> None:
    store.add(name, 1)
    deadline = time.monotonic() + timeout
    while store.add(name, 0) < parties:
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier {name}: other workers did not arrive within {timeout:.0f} s")
        time.sleep(0.001)


def main() -> int:
    host, port, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    world, first, last, workers, connections = (int(x) for x in sys.argv[4:9])
    import torch.distributed as dist
    from slurmdist import bounds, rendezvous
    from slurmdist.distenv import DistEnv
    from slurmdist.errors import RendezvousError

    timeout = timedelta(seconds=300)
    times = {}
    start = time.perf_counter()
    sockets = [dist.TCPStore(host, port, None, False, timeout) for _ in range(min(connections, last - first))]
    times["connect"] = time.perf_counter() - start
    clients = [sockets[i % len(sockets)] for i in range(last - first)]
    control = clients[0]
    barrier(control, f"{prefix}/b/connected", workers)

    start = time.perf_counter()
    for client in clients:
        if client.add(f"{prefix}/base/count", 1) == world:
            client.set(f"{prefix}/base/go", "1")
    times["baseline_arrive"] = time.perf_counter() - start
    barrier(control, f"{prefix}/b/base", workers)
    start = time.perf_counter()
    for client in clients:
        client.wait([f"{prefix}/base/go"])
    times["baseline_wait"] = time.perf_counter() - start

    def env(rank: int) -> DistEnv:
        return DistEnv(launcher="slurm", rank=rank, local_rank=0, world_size=world, local_world_size=1,
                       node_rank=rank, num_nodes=world, master_addr=host, master_port=port, job_id="bench")

    deadline = bounds.Deadline(300.0)
    barrier(control, f"{prefix}/b/ready", workers)
    start = time.perf_counter()
    meetings = []
    for rank, client in zip(range(first, last), clients):  # as connect() does: the attempt, then the check-in
        meetings.append(rendezvous.Rendezvous(client, env(rank), rendezvous.current_keys(client, f"{prefix}/ok", world),
                                              deadline))
        meetings[-1].check_in()
    times["slurmdist_check_in"] = time.perf_counter() - start
    barrier(control, f"{prefix}/b/checked", workers)
    start = time.perf_counter()
    for meeting in meetings:
        meeting.wait_all()
    times["slurmdist_wait_all"] = time.perf_counter() - start

    missing_keys = rendezvous.Keys(f"{prefix}/missing")
    for rank, client in zip(range(first, last), clients):
        if rank % 8 != 7:
            rendezvous.Rendezvous(client, env(rank), missing_keys, deadline).check_in()
    barrier(control, f"{prefix}/b/missing", workers)
    if first == 0:
        reporter = rendezvous.Rendezvous(clients[1], env(1), missing_keys, deadline)
        start = time.perf_counter()
        try:
            reporter.fail()
        except RendezvousError as exc:
            times["report_missing"] = time.perf_counter() - start
            missing = rendezvous.compress_ranks([rank for rank in range(world) if rank % 8 == 7])
            times["report_names_them"] = (f"{world - world // 8} of {world} ranks arrived; rank(s) {missing} never "
                                          "arrived") in str(exc)
        else:
            raise SystemExit("Rendezvous.fail() did not raise with ranks missing")
    print(json.dumps(times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
