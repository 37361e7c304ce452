"""Watch a running rendezvous from outside, as one more client of its store (used to time injected faults)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Mapping, Sequence

from slurmdist.detection import detect
from slurmdist.rendezvous import Keys, run_prefix


def wait_until_checked_in(port: int, environ: Mapping[str, str], ranks: Sequence[int], timeout: float) -> None:
    """Block until each of `ranks` has checked in at the store on this host's `port`; `environ` is any rank's
    launch environment (it names the keys). Raises TimeoutError after `timeout` seconds."""
    import torch.distributed as dist

    keys = Keys(run_prefix(detect(environ), environ, 0))
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout))
    end = time.monotonic() + timeout
    while not store.check([keys.arrived(rank) for rank in ranks]):
        if time.monotonic() > end:
            raise TimeoutError(f"ranks {list(ranks)} did not check in at port {port} within {timeout:.0f} s")
        time.sleep(0.05)
