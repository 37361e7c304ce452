"""The rendezvous store `slurmdist run` hosts for the command it starts, as torchrun's agent does.

A torchrun-style script (`init_process_group()` over env://) makes rank 0 start the store inside its own
init, after importing torch: ranks that get there first find nothing listening and sit in torch's connect
back-off (0.5 s and more per rank on the local cluster). So `slurmdist run` on rank 0 listens on the master
port before it execs the command, and hands the socket to a small process that serves the store on it. Every
rank's command joins as a client, told so by torch's own switch for an agent's store
(`TORCHELASTIC_USE_AGENT_STORE=True`, which `slurmdist.init()` honours too). A connection made before the
store is up waits in the socket's backlog instead of being refused.

The store host lives exactly as long as the command: it watches the command's process (a pidfd of it, taken
before the exec, which keeps the pid), from before it imports torch, and exits once the command has exited.
It leaves every signal to the command (a preemption signal must not take the store away mid-checkpoint).
It is not the command's child: a command that waits for any child of its own (`os.wait()`) would wait for
the store host, which waits for the command.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import signal
import socket
import sys
import threading
import time
from typing import List, Mapping, Optional, Sequence

from . import store_server
from .bounds import DEFAULT_TIMEOUT, readable_within
from .distenv import DistEnv
from .rendezvous import agent_serves_store

PID_POLL = 0.2  # seconds between checks that the command is still running, where there is no pidfd
LEFT_TO_THE_COMMAND = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")


def wanted(env: DistEnv, environ: Mapping[str, str]) -> bool:
    """Host a store for this launch? Not for one process, not where an agent already serves one (run under
    torchrun), and not when this interpreter has no torch to serve it with. Every rank decides alike."""
    return (
        env.world_size > 1
        and not agent_serves_store(environ)
        and importlib.util.find_spec("torch") is not None
    )


def start(listener: socket.socket, world_size: int, serve_within: float) -> None:
    """Start the store host on `listener`, watching this process (the command exec'd next keeps its pid), and
    close this process's copies (the command must not hold the port: if the host dies, clients should see a
    refused connection, not a silent listener). A host not serving after `serve_within` seconds gives up."""
    pidfd = _pidfd_of_this_process()
    # The host gets copies numbered 3 and up: in a task started with stdin or stdout closed, the socket or the
    # pidfd got 0 or 1, which the detach step points at /dev/null before the host starts.
    sent = [_above_stdio(listener.fileno())] + ([_above_stdio(pidfd)] if pidfd is not None else [])
    watched = f"pidfd:{sent[1]}" if pidfd is not None else f"pid:{os.getpid()}"
    port = listener.getsockname()[1]
    argv = [sys.executable, "-m", "slurmdist.store_host", str(sent[0]), str(port), str(world_size), watched,
            str(serve_within)]
    try:
        _spawn_detached(argv, sent)
    finally:
        listener.close()
        for fd in sent + ([pidfd] if pidfd is not None else []):
            os.close(fd)


def _pidfd_of_this_process() -> Optional[int]:
    """How the store host will know the command has exited: a pidfd (Linux 5.3+; no pid-reuse race), else None
    (the host polls the pid)."""
    try:
        return int(os.pidfd_open(os.getpid()))  # type: ignore[attr-defined]  # Python 3.9+, Linux
    except (AttributeError, OSError):
        return None


def _above_stdio(fd: int) -> int:
    """A copy of `fd` numbered 3 or above (closed on exec until made inheritable)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


# Start their arguments in the background and exit, so the store host is nobody's child here: a shell, else
# (no /bin/sh, as in a distroless container) a bare Python that spawns it.
DETACH_SHELL = ("/bin/sh", "-c", '"$@" </dev/null >/dev/null &', "slurmdist-detach")
DETACH_PYTHON = (sys.executable, "-S", "-c", "import os, sys; os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)")


def _spawn_detached(argv: List[str], fds: List[int]) -> None:
    """Run `argv` as a grandchild that keeps `fds`: the intermediate exits at once (reaped here), so the
    command exec'd next in this process never has the store host among its children. posix_spawn, not fork:
    this process may have threads (a name lookup still running past its bound), and a forked child of a
    threaded process can deadlock on a lock one of them held. stderr stays: the host's one message goes to
    the task's log. The shell starts it with SIGINT and SIGQUIT ignored, which the host ignores anyway."""
    for fd in fds:
        os.set_inheritable(fd, True)
    try:
        intermediate = os.posix_spawn(DETACH_SHELL[0], [*DETACH_SHELL, *argv], os.environ)
    except FileNotFoundError:
        quiet = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                 (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
        intermediate = os.posix_spawn(DETACH_PYTHON[0], [*DETACH_PYTHON, *argv], os.environ, file_actions=quiet)
    os.waitpid(intermediate, 0)


def serve(fd: int, port: int, world_size: int, watched: str, poll: float = PID_POLL,
          serve_within: float = DEFAULT_TIMEOUT, import_within: Optional[float] = None) -> int:
    """In the store host: serve a TCPStore on the inherited listening socket until the watched command has
    exited. The watch starts before torch is imported: a command that ends at once (not found, a crash)
    must not leave the port held for the seconds that import takes.

    Two bounds, each closing the port and exiting when it runs out (the ranks' connections wait in its backlog,
    and torch's client would wait there without bound): `import_within` for importing torch (default: the
    larger of `serve_within` and DEFAULT_TIMEOUT; an import stuck on a stalled file system), then
    `serve_within` for starting the store. The rendezvous timeout does not count the import, as `init()`'s
    does not: a 3 s timeout on a busy node, where the import alone took longer, closed the port of a healthy
    job, and its ranks then sat in torch's client for its 30 minutes."""
    for name in LEFT_TO_THE_COMMAND:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    threading.Thread(target=_exit_after, args=(watched, poll), name="slurmdist-watch", daemon=True).start()
    importing = _bound(fd, port, max(serve_within, DEFAULT_TIMEOUT) if import_within is None else import_within,
                       "was still importing torch")
    import torch.distributed as dist

    importing.cancel()
    starting = _bound(fd, port, serve_within, "imported torch but could not start the store")
    store = store_server.serve(dist, fd, port, world_size)  # served by torch's threads while this one waits
    starting.cancel()
    wait_for_exit(watched, poll)
    del store
    return 0


def _bound(fd: int, port: int, seconds: float, doing: str) -> threading.Timer:
    """A started timer that gives the port up after `seconds`, saying what the host `doing` was then."""
    timer = threading.Timer(seconds, _give_up, args=(fd, port, seconds, doing))
    timer.daemon = True
    timer.start()
    return timer


def _give_up(fd: int, port: int, seconds: float, doing: str) -> None:
    print(f"slurmdist run: the store host for port {port} {doing} after {seconds:.0f} s (a stalled file system, a "
          "swapping node); closing the port, so the ranks' own start fails when its timeout runs out "
          "(slurmdist.init()'s; torch's init_process_group waits 30 min unless given a timeout). Raise `slurmdist "
          "run --timeout` (or SLURMDIST_INIT_TIMEOUT) if the node is only slow, or use --no-store",
          file=sys.stderr, flush=True)
    os.close(fd)
    os._exit(1)


def _exit_after(watched: str, poll: float) -> None:
    """Ends the process when the command ends while torch is still being imported."""
    wait_for_exit(watched, poll)
    os._exit(0)


def wait_for_exit(watched: str, poll: float = PID_POLL) -> None:
    """Block until the process `watched` names ('pidfd:N' or 'pid:N') has exited."""
    kind, _, number = watched.partition(":")
    if kind == "pidfd":
        readable_within(int(number))  # a pidfd turns readable when its process ends
        return
    pid = int(number)
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # alive, and someone else's: the pid was reused, so ours is gone
            return
        time.sleep(poll)


def main(argv: Optional[Sequence[str]] = None) -> int:
    fd, port, world_size, watched, *bounds = sys.argv[1:] if argv is None else argv
    seconds = [float(bound) for bound in bounds]  # serve_within, then import_within (tests), each optional
    serve_within = seconds[0] if seconds else DEFAULT_TIMEOUT
    import_within = seconds[1] if len(seconds) > 1 else None
    try:
        return serve(int(fd), int(port), int(world_size), watched, serve_within=serve_within,
                     import_within=import_within)
    except Exception as exc:  # the command's ranks then fail at their own timeout; say why here first
        print(f"slurmdist run: the rendezvous store on port {port} could not be served: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
