"""Ranks that torchrun started: one process per node (or per device), joined into the runtime's MPI cluster.

torchrun starts each process alone, so none of them is part of an MPI job. They join through an MPI port
(MPI_Comm_connect/accept): rank 0 opens it and the others read its name from torch.distributed's store at
MASTER_ADDR:MASTER_PORT, the store torchrun already set up for DDP. Open MPI connects processes of different jobs
through its name server, ompi-server, which rank 0 starts and whose address goes around the same way; each process
must know it before MPI starts. After the join the ranks are one MPI cluster, as mpirun's are: the same one-sided
steals and collectives.
"""
import atexit
import datetime
import os
import shutil
import signal
import subprocess
import tempfile
import time

from . import _core

_state = {"store": None, "joins": 0}


def _store(rank, world, timeout):
    """The store at MASTER_ADDR:MASTER_PORT: torchrun's agent serves it (TORCHELASTIC_USE_AGENT_STORE=True), else
    rank 0 does, as init_process_group(init_method="env://") would."""
    if _state["store"] is None:
        import torch.distributed as dist
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if name not in os.environ:
                raise _core.ConfigError(f"cluster = 'torchrun': {name} is not set (start the processes with torchrun)")
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        serves = rank == 0 and not agent
        try:
            store = dist.TCPStore(host, port, world, serves, datetime.timedelta(seconds=timeout), multi_tenant=True)
        except RuntimeError as e:
            what = (f"rank 0 of {world} serves torch.distributed's store at {host}:{port}, and the other ranks did not all "
                    f"connect to it within {timeout:.0f} s" if serves else
                    f"rank {rank} of {world} cannot reach torch.distributed's store at {host}:{port}")
            raise _core.TimeoutError(f"cluster = 'torchrun': {what}: {e}") from e
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        _state["store"] = dist.PrefixStore(f"stealbatch/attempt_{attempt}/", store)
    return _state["store"]


def _start_name_server(timeout):
    """Starts ompi-server for this job (it ends with this process) and returns its URI."""
    program = shutil.which("ompi-server")
    if program is None:
        raise _core.ConfigError("cluster = 'torchrun': Open MPI's ompi-server is not on PATH; processes that torchrun "
                                "starts join through it (Debian: apt-get install openmpi-bin), or start them with mpirun")
    folder = tempfile.mkdtemp(prefix="stealbatch-ompi-")
    uri_file = os.path.join(folder, "uri")

    def die_with_parent():  # Linux: SIGTERM to the server when the thread that starts it ends (a killed rank 0 too)
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    log = open(os.path.join(folder, "log"), "wb")  # a file, not a pipe that nobody drains
    server = subprocess.Popen([program, "--no-daemonize", "-r", uri_file], stdout=log, stderr=subprocess.STDOUT,
                              preexec_fn=die_with_parent)
    log.close()

    def stop():
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(uri_file) and os.path.getsize(uri_file) > 0:
            with open(uri_file) as f:
                return f.read().strip()
        if server.poll() is not None:
            with open(os.path.join(folder, "log"), errors="replace") as f:
                said = f.read().strip()
            raise _core.ConfigError(f"cluster = 'torchrun': ompi-server ended (status {server.returncode}): {said}")
        time.sleep(0.05)
    raise _core.TimeoutError(f"cluster = 'torchrun': ompi-server wrote no address in {timeout:.0f} s")


def join(rank, world, timeout=300.0):
    """Joins this process (rank `rank` of `world`) with the others torchrun started; returns the cluster.

    Every rank calls it, in the same order as the others when a process makes several runtimes. Each wait is bounded
    by `timeout` seconds: a rank that never comes is named by the store's error, not waited for forever."""
    if not _core.has_mpi:
        raise _core.ConfigError("cluster = 'torchrun': this stealbatch was built without MPI, through which ranks join "
                                "(install libopenmpi-dev and rebuild)")
    store = _store(rank, world, timeout)
    n = _state["joins"]
    _state["joins"] += 1
    key = f"join_{n}/"
    if n == 0:
        if rank == 0:
            store.set("ompi_server", _start_name_server(timeout))
        # Before MPI starts in this process: Open MPI reads its parameters from the environment at MPI_Init.
        os.environ["OMPI_MCA_pmix_server_uri"] = store.get("ompi_server").decode()
    if rank == 0:
        store.set(key + "port", _core.mpi_open_port())
    port = store.get(key + "port").decode()
    # Every rank is up before any waits in the join, whose connect and accept wait up to Open MPI's 600 s.
    store.add(key + "arrived", 1)
    deadline = time.monotonic() + timeout
    while store.add(key + "arrived", 0) < world:
        if time.monotonic() > deadline:
            raise _core.TimeoutError(f"cluster = 'torchrun': {store.add(key + 'arrived', 0)} of {world} ranks arrived in "
                                     f"{timeout:.0f} s; the others never started, or failed before joining")
        time.sleep(0.01)
    # One connect at a time, in rank order: rank r goes once rank r - 1 is in.
    def wait_turn():
        store.wait([f"{key}in_{rank - 1}"])

    def pass_turn():
        store.set(f"{key}in_{rank}", b"1")

    return _core.mpi_join(rank, world, port, wait_turn, pass_turn)
