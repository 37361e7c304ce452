"""The `slurmdist` command line. Errors go to stderr with exit status 2, never as a traceback."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import signal
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .argv import command_words
from .bounds import positive_seconds
from .distenv import DistEnv
from .envvars import whole_number
from .errors import SlurmdistError

Handler = Callable[[argparse.Namespace], int]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:
            if done.code:  # a usage error, already on stderr
                if _meant_for_eval(sys.argv[1:] if argv is None else argv):
                    print("false")  # as _env does on its errors: the `eval "$(...)" && ./train.sh` stops
                raise
            # --help and --version: argparse ignores a failed write, so their text must be flushed here.
            _require_stdout()
            sys.stdout.flush()
            return 0
        if not getattr(args, "handler", None):
            parser.print_usage(sys.stderr)
            print(f"{parser.prog}: error: a command is required", file=sys.stderr)
            return 2
        if args.handler is not _run:
            _require_stdout()
        status = args.handler(args)
        sys.stdout.flush()  # here, where a failed write is reported below, not at exit as a traceback
        return status
    except SlurmdistError as error:
        print(f"slurmdist: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupted:
        if str(interrupted):  # what became of what was under way (a submission)
            print(f"\nslurmdist: {interrupted}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `slurmdist hostlist expand ... | head -1`: the reader has gone, which is fine
        _silence_stdout()
        return 128 + signal.SIGPIPE  # what a shell reports for a writer that SIGPIPE ended
    except OSError as error:  # `> /dev/full`, a file system gone read-only: as coreutils report a failed write
        print(f"slurmdist: error: {_as_said(error)}", file=sys.stderr)
        if sys.stdout is not None:
            try:
                sys.stdout.flush()
            except OSError:
                _silence_stdout()
        return 1


# What only a write fails with: said as coreutils say it ("write error: No space left on device").
_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def _as_said(error: OSError) -> str:
    if error.errno in _WRITE_ERRORS and error.filename is None and error.strerror:
        return f"write error: {error.strerror}"
    return str(error)


def _require_stdout() -> None:
    """Started with `>&-`, print() would drop every line: fail (status 1) instead of printing nothing."""
    if sys.stdout is None:
        raise OSError("standard output is closed, so there is nowhere to write the result; redirect it (to a "
                      "file, or /dev/null to discard it)")


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it again at exit, and would print a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class _Parser(argparse.ArgumentParser):
    """Reports a failed write of --help or --version (`> /dev/full`, `>&-`) as every other output's, where
    argparse ignores it and exits 0 having printed nothing. Takes no abbreviated options: sbatch's own
    spellings are prefixes of slurmdist's (`--gpus 8`, a job's total there, would read as `--gpus-per-node 8`,
    `--cpus` as `--cpus-per-task`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _print_message(self, message: str, file: Any = None) -> None:
        if file is None and sys.stdout is None:  # print_help() and --version were given the closed stdout
            _require_stdout()
        if message and file is not None and file is sys.stdout:
            file.write(message)
            return
        super()._print_message(message, file)


class _Subcommand(_Parser):
    """A subcommand's parser reports options it does not know itself, with its own usage: argparse would
    leave them to the top-level parser, whose usage (`slurmdist [-h] [--version] COMMAND ...`) does not
    show the options the user got wrong."""

    # What to use instead of an sbatch option the command sets itself ("--output" -> "use --folder DIR"), for
    # the command whose options those are; None for any other word.
    instead_of: Callable[[str], Optional[str]] = staticmethod(lambda word: None)

    def parse_known_args(  # type: ignore[override]
        self, args: Optional[Sequence[str]] = None, namespace: Optional[argparse.Namespace] = None
    ) -> Tuple[argparse.Namespace, List[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            hint = ""
            if "--sbatch" in self._option_string_actions and any(extra.startswith("-") for extra in extras):
                hint = ("; any other sbatch option goes through --sbatch with its long name: --sbatch exclusive, "
                        "--sbatch constraint=a100")
            said = next(filter(None, map(self.instead_of, extras)), None)
            if said is not None:  # an sbatch option the command sets itself: --sbatch would refuse it too
                hint = f"; {said}{hint}" if len(extras) > 1 else f"; {said}"
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="slurmdist",
        description="Start torch.distributed correctly under Slurm, MPI, torchrun and submitit.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Subcommand)

    env = commands.add_parser("env", help="print this process's detected rank, world size and master")
    env.add_argument("--format", choices=("text", "json", "shell"), default="text",
                     help="text and json: what detect() read, with no lookup (the master as the nodelist names "
                          "it; no device or backend, which init() chooses); shell: `export RANK=...` lines for eval, "
                          "in torchrun's variable names, with the master resolved as `slurmdist run` resolves it "
                          "(under mpirun across nodes over MPI: every rank must run it). Check its status before "
                          "the eval: `vars=$(slurmdist env --format shell) && eval \"$vars\" && ./train.sh` (on an "
                          "error it also prints `false`)")
    env.set_defaults(handler=_env)

    run = commands.add_parser(
        "run",
        help="run a command with torchrun's variables set (RANK, LOCAL_RANK, WORLD_SIZE, ...)",
        description="Exec CMD with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
        "set from the detected launcher, so a torchrun-style script runs unchanged under srun or mpirun: "
        "`srun slurmdist run -- python train.py`. On rank 0 a small process serves the rendezvous store "
        "from the start, as torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE=True tells the command). "
        "Start it with `srun --kill-on-bad-exit=1`: a rank that gives up (exit 2) then ends the step, where rank "
        "0's command, plain torch, would wait for it for torch's own timeout.",
    )
    run.add_argument("--timeout", type=float, default=None,
                     help="seconds for the agreement on the master over MPI, for the store host to start "
                     "serving, and for the other ranks to find it listening (default SLURMDIST_INIT_TIMEOUT, "
                     "else 300)")
    run.add_argument("--no-store", dest="store", action="store_false",
                     help="do not host the rendezvous store on rank 0 (by default a small process serves it, as "
                     "torchrun's agent does, so that no rank waits in torch's connect back-off)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    run.set_defaults(handler=_run)

    hosts = commands.add_parser("hostlist", help="expand, compress, count or take the first host of a Slurm hostlist")
    hosts.add_argument("action", choices=("expand", "compress", "first", "count"))
    hosts.add_argument("hosts", nargs="+", help="a hostlist such as node[1-4] (this job's: \"$SLURM_JOB_NODELIST\"); "
                       "for compress, host names; - reads them from standard input (commas, spaces or lines apart, "
                       "as `scontrol show hostnames` prints them)")
    hosts.add_argument("--limit", type=_host_limit, default=None, metavar="N",
                       help="expand and compress: refuse lists of more than N hosts (default 2**20, which bounds "
                       "memory)")
    hosts.set_defaults(handler=_hostlist)

    # Subcommands defined next to the feature they drive; both modules import nothing heavy at load time.
    from . import sbatch_render, submit_cli

    submit_cli.register(commands)  # `slurmdist submit`
    sbatch_render.register(commands)  # `slurmdist sbatch`

    return parser


def _meant_for_eval(argv: Sequence[str]) -> bool:
    """Whether a command line argparse refused was `slurmdist env` in its shell format (`--format shel`, an
    unknown option beside `--format shell`), whose output a shell evals."""
    words = [str(word) for word in argv]
    if not words or words[0] != "env":
        return False
    values = [word.partition("=")[2] for word in words if word.startswith("--format=")]
    values += [value for option, value in zip(words, words[1:]) if option == "--format"]
    return any(value[:2] and "shell".startswith(value[:2]) for value in values)


def _env(args: argparse.Namespace) -> int:
    from .detection import detect
    from .rendezvous import resolve_master

    if args.format != "shell":
        print(format_env(detect(), args.format))
        return 0
    try:
        # For `eval` before a torchrun-style start: what `slurmdist run` would set, so a master that is not in
        # DNS is Slurm's NodeAddr and a single process gets a port (every rank must run it under MPI).
        variables = command_variables(resolve_master(detect()))
    except BaseException:
        # `eval ""` succeeds: `eval "$(slurmdist env --format shell)" && ./train.sh` would start train.sh
        # without the variables. `false` stops it there, and leaves an interactive shell open.
        print("false")
        raise
    print("\n".join(f"export {name}={shlex.quote(value)}" for name, value in variables.items()))
    return 0


def format_env(env: DistEnv, style: str) -> str:
    """The detected topology as text or JSON."""
    if style == "json":
        return json.dumps(env.as_dict(), sort_keys=True)
    fields = env.as_dict()
    width = max(len(name) for name in fields)
    return "\n".join(f"{name:<{width}}  {_shown(name, value, env)}" for name, value in fields.items())


def _shown(name: str, value: object, env: DistEnv) -> str:
    """A field's text; an unknown master says where init() will learn it, so '-' does not look like a bug."""
    if value is not None:
        return str(value)
    if name in ("master_addr", "master_port") and env.world_size > 1:
        from .mpi_share import MPI_LAUNCHERS

        if env.launcher == "slurm":
            return "- (srun -m arbitrary: init() reads it from SLURM_HOSTFILE)"
        if env.launcher in MPI_LAUNCHERS:
            return "- (init() agrees on it over MPI)"
        return "- (not set: init() needs MASTER_ADDR and MASTER_PORT)"
    return "-"


def _gloo_interface(env: DistEnv) -> Optional[str]:
    """The interface the command's gloo groups should bind (see slurmdist.interfaces), or None to leave it."""
    import socket

    from . import interfaces
    from .hosts import addresses, names_this_host

    # A single process too, as init() does: its gloo would otherwise look up this host's name (a DNS query,
    # a 5 s stall where DNS is broken) for a group that talks to no one.
    if interfaces.user_choice(os.environ) is not None or env.master_addr is None:
        return None
    single_node = env.local_world_size == env.world_size
    # Resolved: a name that resolves, or Slurm's NodeAddr for one that does not.
    master: Optional[str] = env.master_addr
    if not single_node and interfaces.ip_of(env.master_addr) is None:  # a name: its first address
        master = next(iter(addresses(env.master_addr, 5.0)), None)
    own_name = names_this_host(env.master_addr, socket.gethostname())
    return interfaces.gloo_interface_for_command(master, single_node, own_name)


def command_variables(env: DistEnv) -> Dict[str, str]:
    """What a torchrun-style command needs, for a resolved `env`: torchrun's variables, and gloo's interface
    towards the master when slurmdist chooses it."""
    from .exporting import torchrun_variables
    from .interfaces import GLOO_INTERFACE_VARIABLE

    variables = torchrun_variables(env)
    interface = _gloo_interface(env)
    if interface is not None:
        variables[GLOO_INTERFACE_VARIABLE] = interface
    return variables


def _run(args: argparse.Namespace) -> int:
    from . import store_host, store_server
    from .bounds import Deadline, init_timeout, timeout_knob
    from .detection import detect
    from .rendezvous import (AGENT_STORE_VARIABLE, RESTART_COUNT_VARIABLE, RUN_ID_VARIABLE, resolve_master,
                             wait_listening)
    from .task_command import not_started_text

    command = command_words(args.command, "slurmdist run", "slurmdist run -- python train.py ARGS...")
    if args.timeout is not None:
        positive_seconds("--timeout", args.timeout, SlurmdistError)
    # Always resolved, not only when detect() left it open: the command's own env:// start (torch's TCPStore)
    # cannot fall back to Slurm's NodeAddr when node names are not in DNS, and would retry until its timeout.
    # Copied before resolve_master: over MPI it may set OMPI_MCA_btl for its own MPI_Init, which must not
    # reach the command's MPI.
    child_env: Dict[str, str] = dict(os.environ)
    # One bound for every wait below (the master over MPI, rank 0's store), as init() has.
    deadline = Deadline(init_timeout(args.timeout, os.environ), timeout_knob(args.timeout, "--timeout"))
    env = resolve_master(detect(), deadline=deadline, finalize_mpi=True)  # exec next: no atexit to finalize
    child_env.update(command_variables(env))
    # What torch.distributed.is_torchelastic_launched() reads: a script that starts its group only when torchrun
    # launched it would otherwise train alone in every rank. One id per launch, as torchrun's --rdzv-id is;
    # under torchrun (slurmdist run inside it), torchrun's own stays.
    child_env.setdefault(RUN_ID_VARIABLE, f"slurmdist-{env.job_id or 'nojob'}-{env.master_port}")
    unstartable = _unstartable(command[0], child_env.get("PATH", os.defpath))
    if unstartable is not None:  # before rank 0 listens: the others then stop at "nothing listens", not in torch
        print(f"slurmdist: error: {unstartable[0]}", file=sys.stderr)
        return unstartable[1]
    if args.store and store_host.wanted(env, os.environ):
        master_addr, master_port = env.master_endpoint()
        if env.rank == 0:
            listener = store_server.listen(master_port, "slurmdist run on rank 0",
                                           store_server.ipv6_clients(master_addr))
            store_host.start(listener, env.world_size, deadline.remaining())
        else:
            # Rank 0's `slurmdist run` listens within milliseconds of starting. Waiting for it here keeps the
            # bound: the command's torch client would wait for an absent rank 0 for its own timeout (30 min).
            wait_listening(master_addr, master_port, deadline, env.world_size, rank=env.rank,
                           store_of_a_command=True)
        child_env[AGENT_STORE_VARIABLE] = "True"
        # Older torch releases read the agent's restart count next to that switch and fail without it.
        child_env.setdefault(RESTART_COUNT_VARIABLE, "0")
    # Python ignores SIGPIPE and SIGXFSZ for itself, and exec keeps an ignored signal ignored: the command
    # (`cmd | head` in a shell script, a write past the file-size limit) must get the defaults back.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        # exec, not a child process: Slurm's signals (preemption, time limit) reach the command directly.
        os.execvpe(command[0], command, child_env)
    except OSError as exc:  # ENOEXEC (a script without #!), E2BIG, or what changed since the check above
        print(f"slurmdist: error: {not_started_text(command[0], exc, None)}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0  # pragma: no cover - execvpe does not return


def _unstartable(program: str, search_path: str) -> Optional[Tuple[str, int]]:
    """Why exec would fail to start `program` (looked up on `search_path` as execvp does: an empty entry is the
    current directory, and a match that is not executable is remembered while the search goes on), with a
    shell's status for it (127 not found, 126 not executable); None when it would start, as far as can be told
    without starting it. Checked before rank 0 serves the store: a rank 0 whose command is missing would leave
    the other ranks' commands joining a store that no rank 0 will ever use, waiting for torch's 30 minutes."""
    from .task_command import not_started_text

    if os.sep in program:
        candidates = [program]
    else:
        candidates = [os.path.join(folder or os.curdir, program) for folder in search_path.split(os.pathsep)]
    denied = None
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return _interpreter_missing(program, candidate)
        if os.path.exists(candidate):  # a directory, or a file without execute permission: exec says EACCES
            denied = denied or candidate
    if denied is not None:
        return not_started_text(program, PermissionError(errno.EACCES, "not executable", denied), None), 126
    return not_started_text(program, FileNotFoundError(errno.ENOENT, "not found", program), None), 127


def _interpreter_missing(program: str, path: str) -> Optional[Tuple[str, int]]:
    """For a script whose #! line names an interpreter that does not exist (a console script of a deleted
    environment), or one that is not executable, what exec would fail with (ENOENT 127, EACCES 126); for a
    text file with no #! line, which a shell would run but exec cannot (ENOEXEC), 126; None otherwise."""
    from .task_command import started_where

    try:
        with open(path, "rb") as script:
            first = script.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        if first.startswith(b"\x7fELF") or b"\0" in first:  # a program: exec decides
            return None
        return (f"cannot run {program!r}{started_where()}: it is a text file without a #! first line, which only a "
                "shell would run: add one (#!/bin/bash, or #!/usr/bin/env python3), or name its interpreter (bash "
                f"{program})", 126)
    words = first[2:].split()
    interpreter = os.fsdecode(words[0]) if words else ""
    if first.rstrip(b"\n").endswith(b"\r"):  # Windows line ends: the kernel reads '/bin/bash\r' as the name
        last = os.fsdecode(words[-1] if words else b"") + "\r"  # split() took the carriage return off
        return (f"cannot run {program!r}{started_where()}: its #! line ends in a carriage return (the file has "
                "Windows line ends), so "
                f"the kernel takes {last!r} for the {'interpreter' if len(words) <= 1 else 'last argument'}: convert "
                f"it (dos2unix {program}, or sed -i 's/\\r$//' {program})", 127)
    if not interpreter or (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):
        return None
    exists = os.path.exists(interpreter)
    return (f"cannot run {program!r}{started_where()}: its #! line names the interpreter {interpreter!r}, which "
            f"{'is not executable' if exists else 'does not exist'}: reinstall the command in this environment, or "
            "run it with its interpreter", 126 if exists else 127)


def _host_limit(text: str) -> int:
    limit = whole_number(text)
    if limit is None and text.isdigit() and text.isascii():
        raise argparse.ArgumentTypeError(f"{text!r} is too large for a number of hosts (the default "
                                         "limit is 2**20); give a smaller one")
    if limit is None or limit < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of hosts, 1 or more")
    return limit


def _hostlist(args: argparse.Namespace) -> int:
    from . import hostlist

    # Each argument is a list of its own, as for `scontrol show hostnames A B`: joined first, two broken
    # halves ('n[1-2' '5]') would make one valid list, and an error would quote text nobody typed.
    lists = [_standard_input_hosts() if word == "-" else word for word in args.hosts]
    # An empty argument is most often "$SLURM_JOB_NODELIST" outside a job; standard input may be empty, as
    # for `wc -l` (count says 0).
    if "-" not in args.hosts and not any(text.replace(",", "").strip() for text in lists):
        shown = ",".join(lists)
        raise SlurmdistError(f"hostlist {args.action}: the hostlist {shown!r} names no host (outside a Slurm job, "
                             "\"$SLURM_JOB_NODELIST\" is empty): give one such as node[1-4]")
    limit = hostlist.DEFAULT_LIMIT if args.limit is None else args.limit
    if args.action in ("count", "first"):
        counts = [hostlist.count(text) for text in lists]  # checks every list whole, as expand does
        if args.action == "count":
            print(sum(counts))
        else:  # an empty list has no first host: first() says so, naming it
            print(hostlist.first(next((text for text, hosts in zip(lists, counts) if hosts), lists[0])))
        return 0
    hosts: List[str] = []
    for text in lists:
        hosts += hostlist.expand(text, limit=limit)
        if len(hosts) > limit:
            raise SlurmdistError(f"hostlist {args.action}: the lists name more than {limit} hosts together; "
                                 "raise --limit if that many is meant")
    if args.action == "expand":
        if hosts:  # one line per host: none for empty standard input, as `count` says 0
            print("\n".join(hosts))
    elif hosts:  # compress; empty standard input: no line at all, as expand prints none
        print(hostlist.compress(hosts))
    return 0


def _standard_input_hosts() -> str:
    """What `-` stands for: the hosts on standard input, for pipes and lists too long for one argument."""
    if sys.stdin is None:  # started with `<&-`
        raise SlurmdistError("hostlist: - reads the hosts from standard input, which is closed; pipe them in, "
                             "or give them as arguments")
    try:
        return sys.stdin.read()  # as written: an error then quotes the text given, line ends and all
    except OSError as error:  # a terminal gone away (EIO): not the write error the top level would call it
        raise SlurmdistError(f"hostlist: cannot read the hosts from standard input: {error.strerror or error}") from None


def _version() -> str:
    from . import __version__

    return __version__
