"""When `slurmdist run` hosts the rendezvous store: a pure decision over the detected launch and environment."""

from __future__ import annotations

import pytest

from slurmdist import detect
from slurmdist.rendezvous import AGENT_STORE_VARIABLE
from slurmdist.store_host import open_on_socket, wanted
from tests.conftest import load_case


@pytest.mark.parametrize("case, index, extra, expected", [
    ("slurm/srun_N2_tpn2", 0, {}, True),  # rank 0 hosts, the other ranks are told to join
    ("slurm/srun_N2_tpn2", 3, {}, True),
    ("slurm/srun_N2_tpn2", 0, {AGENT_STORE_VARIABLE: "True"}, False),  # an agent (torchrun's) serves one
    ("slurm/srun_N2_tpn2", 0, {AGENT_STORE_VARIABLE: "False"}, True),
])
def test_every_rank_of_a_launch_decides_alike(case, index, extra, expected):
    environ = {**load_case(case)[index], **extra}
    assert wanted(detect(environ), environ) is expected


def test_one_process_needs_no_store():
    assert wanted(detect({}), {}) is False


def _serve_and_join(dist_module):
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = open_on_socket(dist_module, listener.detach(), port, 2)
    client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
    client.set("who", "client")
    return server.get("who")


def test_the_store_is_served_on_the_inherited_socket():
    import torch.distributed as dist

    assert _serve_and_join(dist) == b"client"


def test_a_torch_whose_libuv_server_refuses_a_socket_gets_the_classic_server():
    import torch.distributed as dist

    class Torch27:
        """torch 2.4-2.7: the default (libuv) server raises on master_listen_fd; use_libuv=False works."""

        @staticmethod
        def TCPStore(*args, **kwargs):
            if kwargs.get("use_libuv", True):
                raise NotImplementedError("libuv TCPStore backend does not support initialization with an listen fd")
            return dist.TCPStore(*args, **kwargs)

    assert _serve_and_join(Torch27) == b"client"


def test_a_port_that_cannot_be_listened_on_is_named(monkeypatch):
    import errno
    import socket

    from slurmdist.errors import RendezvousError
    from slurmdist.store_host import listen

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket, "create_server", refused)
    with pytest.raises(RendezvousError, match="MASTER_PORT=80: Permission denied"):
        listen(80)
