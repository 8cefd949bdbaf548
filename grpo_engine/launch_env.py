"""The environment variables the engine, its launchers and its libraries read, checked once when a command
starts, before anything loads: a bad value is one line naming the variable and what it takes.

Read where they are used, they failed late and anonymously: `WORLD_SIZE=abc` stopped a run with "invalid literal
for int() with base 10: 'abc'", naming no variable; `HF_HUB_OFFLINE=maybe` silently meant online (huggingface_hub
takes any word but 1/ON/YES/TRUE for false); `OMP_NUM_THREADS=abc` was ignored with a note from libgomp, and
`MKL_NUM_THREADS=abc` silently meant one thread.
Variables that disagree with each other are checked too: a WORLD_SIZE above 1 without the RANK, MASTER_ADDR and
MASTER_PORT a launcher sets with it, a MASTER_ADDR that names no host, or (on rank 0) a MASTER_PORT another
program already listens on, waited in the rendezvous for the process
group's whole timeout (30 minutes) before failing with a C++ stack trace. A LOCAL_RANK left without WORLD_SIZE, or
an MPI launcher's process count without MASTER_ADDR, made accelerate start a process group that failed after the
imports naming MASTER_ADDR; a GLOO_SOCKET_IFNAME naming no interface of the machine failed the join blaming
MASTER_ADDR and MASTER_PORT.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Callable, Mapping, Optional

from .config import ConfigError

# The words huggingface_hub reads as true (constants._is_true) and the ones meaning false: anything else is a typo.
_TRUE_WORDS = ("1", "ON", "YES", "TRUE")
_FALSE_WORDS = ("", "0", "OFF", "NO", "FALSE")


def _whole_number(low: int, high: Optional[int] = None) -> Callable[[str], Optional[str]]:
    def problem(text: str) -> Optional[str]:
        expected = f"a whole number >= {low}" if high is None else f"a whole number from {low} to {high}"
        if not text.strip().isdigit() or not text.strip().isascii():
            return expected
        value = int(text)
        return expected if value < low or (high is not None and value > high) else None

    return problem


def _byte_count(text: str) -> Optional[str]:
    # datasets reads it with float() as it is imported: `2GB` stopped the command with "could not convert string to
    # float" naming no variable
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    return None if 0 <= value < float("inf") else "a number of bytes >= 0, such as 2e9 (0: off)"


def _thread_counts(text: str) -> Optional[str]:
    # OpenMP takes a comma-separated list, one count per nesting level
    parts = text.split(",")
    if all(part.strip().isascii() and part.strip().isdigit() and int(part) >= 1 for part in parts):
        return None
    return "a whole number >= 1 (or a comma-separated list of them, one per OpenMP nesting level)"


def _switch(text: str) -> Optional[str]:
    if text.strip().upper() in _TRUE_WORDS + _FALSE_WORDS:
        return None
    return "1 / true / yes / on or 0 / false / no / off"


_DEVICE_ENTRY = re.compile(r"-?\d+|(GPU|MIG)-[0-9A-Za-z/_-]+", re.ASCII)


def _visible_devices(text: str) -> Optional[str]:
    # CUDA reads the list up to its first entry that is no index or UUID and hides the rest: "garbage" (or "0,gpu1")
    # silently left no GPU (or fewer), and run.device auto then trained on the CPU. Empty, -1 and SLURM's
    # NoDevFiles hide every GPU on purpose.
    if text.strip() in ("", "NoDevFiles") or all(_DEVICE_ENTRY.fullmatch(item.strip()) for item in text.split(",")):
        return None
    return ("a comma-separated list of GPU indices (0,1) or UUIDs (GPU-..., MIG-...), or empty / -1 for none "
            "(CUDA stops reading at the first other entry)")


def _debug_level(text: str) -> Optional[str]:
    # torch upper-cases ASCII letters only: "ınfo" (a dotless i) is refused there too
    return None if text.isascii() and text.upper() in ("OFF", "INFO", "DETAIL") else "OFF, INFO or DETAIL"


def _interfaces(text: str) -> Optional[str]:
    # gloo makes one device per comma-separated name (when the text is longer than one character); a name this machine
    # lacks failed the join with "Unable to find address for: eth9", blamed on MASTER_ADDR and MASTER_PORT.
    if len(text) <= 1:
        return None
    try:
        present = [name for _, name in socket.if_nameindex()]
    except OSError:  # no interface list on this platform: gloo's own message stands
        return None
    if all(name in present for name in text.split(",")):
        return None
    return f"comma-separated network interfaces of this machine ({', '.join(present)})"


# Variable -> (what checks its text, what it is for).
ENVIRONMENT: dict[str, tuple[Callable[[str], Optional[str]], str]] = {
    "RANK": (_whole_number(0), "this process's rank, set by the launcher (torchrun, accelerate launch)"),
    "WORLD_SIZE": (_whole_number(1), "the number of processes, set by the launcher"),
    "LOCAL_RANK": (_whole_number(0), "this process's rank on its machine, set by the launcher"),
    "LOCAL_WORLD_SIZE": (_whole_number(1), "the number of processes on this machine, set by the launcher"),
    "MASTER_PORT": (_whole_number(1, 65535), "the rendezvous port of the processes"),
    # MPI launchers' counts (mpirun, srun --mpi): accelerate takes them for RANK and WORLD_SIZE on the CPU
    "PMI_SIZE": (_whole_number(1), "the number of processes, set by an MPI launcher"),
    "PMI_RANK": (_whole_number(0), "this process's rank, set by an MPI launcher"),
    "OMPI_COMM_WORLD_SIZE": (_whole_number(1), "the number of processes, set by Open MPI's mpirun"),
    "OMPI_COMM_WORLD_RANK": (_whole_number(0), "this process's rank, set by Open MPI's mpirun"),
    "MV2_COMM_WORLD_SIZE": (_whole_number(1), "the number of processes, set by MVAPICH's launcher"),
    "MV2_COMM_WORLD_RANK": (_whole_number(0), "this process's rank, set by MVAPICH's launcher"),
    "GLOO_SOCKET_IFNAME": (_interfaces, "the network interfaces the processes of a launched run talk over"),
    "TORCH_DISTRIBUTED_DEBUG": (_debug_level, "torch.distributed's checks and logs"),
    "OMP_NUM_THREADS": (_thread_counts, "CPU threads of torch's OpenMP pool"),
    # torch reads it when OMP_NUM_THREADS is unset, and takes anything it cannot read (abc, -1) as 1 thread: a typo
    # silently trained on one core of many
    "MKL_NUM_THREADS": (_whole_number(1), "CPU threads of torch's MKL and, without OMP_NUM_THREADS, of its pool"),
    "CUDA_VISIBLE_DEVICES": (_visible_devices, "the GPUs CUDA may use"),
    # huggingface_hub reads these with int() as it is imported: `abc` (or blank) stopped the command with "invalid
    # literal for int()" naming no variable, and 0 meant its default, silently
    "HF_HUB_ETAG_TIMEOUT": (_whole_number(1), "seconds huggingface_hub waits for a file's metadata from the Hub"),
    "HF_HUB_DOWNLOAD_TIMEOUT": (_whole_number(1), "seconds huggingface_hub waits for a download from the Hub"),
    "HF_HUB_OFFLINE": (_switch, "read the Hugging Face cache only"),
    "TRANSFORMERS_OFFLINE": (_switch, "read the Hugging Face cache only"),
    "HF_DATASETS_OFFLINE": (_switch, "read the datasets cache only"),
    "HF_DATASETS_IN_MEMORY_MAX_SIZE": (_byte_count, "the largest dataset datasets keeps in memory"),
    # huggingface_hub's other switches, read as its offline one: any word but 1 / on / yes / true meant false, silently
    **{name: (_switch, meaning) for name, meaning in (
        ("HF_HUB_DISABLE_PROGRESS_BARS", "huggingface_hub's download progress bars off"),
        ("HF_HUB_DISABLE_TELEMETRY", "huggingface_hub's usage reports off"),
        ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "huggingface_hub sends the saved token only when asked"),
        ("HF_HUB_DISABLE_SYMLINKS", "the Hugging Face cache without symbolic links"),
        ("HF_HUB_DISABLE_XET", "downloads without the Xet protocol"))},
}

# (rank variable, count variable): a rank is below its count.
_RANKS_BELOW = (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"))
# What accelerate reads for the number of processes on the CPU, in its order, when WORLD_SIZE is unset: above 1,
# it starts a process group, whose rendezvous (torch's env://) needs MASTER_ADDR.
_MPI_SIZES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
# (smaller, larger): a machine's share of the processes is part of all of them.
_AT_MOST = (("LOCAL_WORLD_SIZE", "WORLD_SIZE"), ("LOCAL_RANK", "RANK"))
# What every launcher (torchrun, accelerate launch, deepspeed) sets along with a WORLD_SIZE above 1.
_LAUNCHED_WITH = ("RANK", "MASTER_ADDR", "MASTER_PORT")


def check_environment(environ: Optional[Mapping[str, str]] = None) -> None:
    """ConfigError, in one line naming the variable, for the first variable of ENVIRONMENT that is set to a value
    its reader does not take, or for launch variables that do not hold together."""
    environ = os.environ if environ is None else environ
    for name, (problem_of, meaning) in ENVIRONMENT.items():
        text = environ.get(name)
        if text is None:
            continue
        problem = problem_of(text)
        if problem is not None:
            raise ConfigError(f"environment variable {name}={text[:40]!r}: expected {problem} ({meaning}); "
                              f"fix or unset it")
    for rank, count in _RANKS_BELOW:
        if rank in environ and count in environ and int(environ[rank]) >= int(environ[count]):
            raise ConfigError(f"environment variable {rank}={environ[rank]} must be below {count}={environ[count]} "
                              f"(ranks count from 0); fix or unset them")
    for smaller, larger in _AT_MOST:
        if smaller in environ and larger in environ and int(environ[smaller]) > int(environ[larger]):
            raise ConfigError(f"environment variable {smaller}={environ[smaller]} must be at most "
                              f"{larger}={environ[larger]} (one machine's processes are among all of them); fix or "
                              f"unset them")
    if "LOCAL_RANK" in environ and "WORLD_SIZE" not in environ:
        # accelerate starts a process group whenever LOCAL_RANK is set, which then failed after the imports naming
        # MASTER_ADDR ("environment variable MASTER_ADDR expected"), not the variable left over from another launch
        raise ConfigError(f"environment variable LOCAL_RANK={environ['LOCAL_RANK']} is set without WORLD_SIZE: "
                          f"accelerate then starts a process group, which needs the WORLD_SIZE, RANK, MASTER_ADDR and "
                          f"MASTER_PORT a launcher sets with it; unset LOCAL_RANK (left from another launch?) or start "
                          f"the run with torchrun or accelerate launch")
    if int(environ.get("WORLD_SIZE", "1")) > 1:
        _check_rendezvous(environ)
    elif "WORLD_SIZE" not in environ:
        mpi = next((name for name in _MPI_SIZES if name in environ), None)
        if mpi is not None and int(environ[mpi]) > 1:
            if not environ.get("MASTER_ADDR", "").strip():
                raise ConfigError(f"environment variable {mpi}={environ[mpi]} (an MPI launch) asks for {environ[mpi]} "
                                  f"processes, which on the CPU meet at MASTER_ADDR, and MASTER_ADDR is unset: export "
                                  f"rank 0's host name as MASTER_ADDR (and a free MASTER_PORT), or unset {mpi} for "
                                  f"one process")
            _check_host(environ["MASTER_ADDR"].strip(), int(environ.get("MASTER_PORT", "29500")))  # accelerate's port


def _check_rendezvous(environ: Mapping[str, str]) -> None:
    """What the processes of a launched run need to find each other, before any of them waits for the others."""
    missing = [name for name in _LAUNCHED_WITH if not environ.get(name, "").strip()]
    if missing:
        raise ConfigError(f"environment variable WORLD_SIZE={environ['WORLD_SIZE']} asks for several processes, but "
                          f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} unset: start them with "
                          f"torchrun or accelerate launch, which set all of these, or unset WORLD_SIZE")
    port = int(environ["MASTER_PORT"])
    _check_host(environ["MASTER_ADDR"].strip(), port)
    # Rank 0 hosts the rendezvous store on MASTER_PORT, on every interface (torch's TCPStore), unless torchrun's
    # agent hosts it there already (then the port is rightly taken). A port in use waited for the group's timeout
    # and then said "could not join the others".
    if environ.get("RANK", "").strip() == "0" and environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip() != "True":
        problem = listen_problem("", port)
        if problem is not None:
            raise ConfigError(f"environment variable MASTER_PORT={port}: rank 0 cannot listen on port {port} "
                              f"({problem}); another run or program holds it: choose a free port (torchrun "
                              f"--master-port, accelerate launch --main_process_port) or stop that program")


def _check_host(host: str, port: int) -> None:
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, ValueError) as exc:  # ValueError: a name IDNA cannot encode, a NUL in it
        raise ConfigError(f"environment variable MASTER_ADDR={host[:60]!r} names no host this machine can find "
                          f"({getattr(exc, 'strerror', None) or exc}): set it to rank 0's host name or address")


def listen_problem(host: str, port: int) -> Optional[str]:
    """Why this machine cannot listen on `host`:`port` ("" every interface): the port in use, an address that is not
    this machine's, a port this user may not take; None when it can (for now: nothing holds it for the caller)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers set it: TIME_WAIT is no owner
            probe.bind((host, port))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
