"""Launched as PyTorch users launch: the ranks of mpirun, and the processes of torchrun, join one job (every rank the
same parameters from rank 0's start, the gradient of the whole batch); a torchrun rank whose peers never come is named, not waited for."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import stealbatch as sb

TESTS = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent("""
    import gc, hashlib, sys, torch
    sys.path.insert(0, {tests!r})
    import stealbatch as sb
    from conftest import mlp, mlp_data, summed_cross_entropy
    x, y = mlp_data()
    rank, world, _ = sb.launch_environment()
    for attempt in range(2):  # the second runtime after the first has gone: a new cluster, the same MPI
        # cluster="auto": mpi under mpirun, torchrun under torchrun. Each rank's module starts from its own seed,
        # and every rank trains from rank 0's values, as DDP's do.
        rt = sb.Runtime(mlp(seed=rank), devices="cpu:1", chunk_size=16)
        one = sb.Runtime(mlp(seed=0), devices="cpu:1", chunk_size=16, cluster="none")
        for s in range(3):
            ids = torch.arange(s * 64, s * 64 + 256) % 512
            r = rt.step(ids, summed_cross_entropy, data=(x, y))
            one.step(ids, summed_cross_entropy, data=(x, y))
        diff = (rt.parameters() - one.parameters()).abs().max().item()
        threads, digest = rt._threads, hashlib.sha256(repr(rt.parameters().tolist()).encode()).hexdigest()
        rt = one = None
        gc.collect()
    print(f"rank {{rank}} of {{world}}: ranks {{r.ranks}}, diff {{diff:.3g}}, threads {{threads}}, bytes {{digest}}", flush=True)
""")


@pytest.mark.skipif(not sb.has_mpi or shutil.which("mpirun") is None, reason="no MPI in this build or no mpirun")
def test_mpirun_ranks_train_one_model(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT.format(tests=TESTS))
    out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "PYTHONPATH",
                          sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    _ranks_agree(out, 2)


def _ranks_agree(out, world):
    assert out.returncode == 0, out.stdout + out.stderr
    # torchrun's --tee prefixes each line with its rank ("[default1]:")
    lines = sorted(line[line.index("rank "):] for line in out.stdout.splitlines() if "rank " in line and " of " in line)
    assert len(lines) == world, out.stdout + out.stderr
    for line in lines:
        assert f"of {world}: ranks {world}," in line
        assert float(line.split("diff ")[1].split(",")[0]) <= 1e-6  # the whole batch's gradient, as one process
        # The node's cores shared among its ranks, not each rank taking them all
        assert int(line.split("threads ")[1].split(",")[0]) == max(1, len(os.sched_getaffinity(0)) // world), line
    assert len({line.split("bytes ")[1] for line in lines}) == 1  # every rank the same parameters


def _torchrun(rendezvous="static"):
    """torchrun's command on one node, on a free port: rendezvous "static" (its agent serves the store at MASTER_PORT)
    or "c10d" (rank 0 serves it). Not --standalone: torch 1.13's takes the fixed port 29400, which the run before may
    still hold."""
    env = dict(os.environ)
    for k in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_SIZE", "PMIX_RANK"):
        env.pop(k, None)
    where = (["--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port", str(_free_port())] if rendezvous == "static"
             else ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{_free_port()}"])
    # --redirects/--tee: torch 1.13's torchrun cannot parse its default ("0") on Python 3.11 (Debian 12's pairing)
    return [sys.executable, "-m", "torch.distributed.run", *where, "--redirects", "1", "--tee", "1"], env


@pytest.mark.skipif(not sb.has_mpi or shutil.which("ompi-server") is None, reason="no MPI in this build or no ompi-server")
@pytest.mark.parametrize("world,rendezvous", [(2, "static"), (3, "c10d")])
def test_torchrun_processes_train_one_model(tmp_path, world, rendezvous):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT.format(tests=TESTS))
    cmd, env = _torchrun(rendezvous)
    out = subprocess.run(cmd + ["--nproc_per_node", str(world), str(script)], capture_output=True, text=True, timeout=240, env=env)
    _ranks_agree(out, world)


@pytest.mark.skipif(not sb.has_mpi or shutil.which("ompi-server") is None, reason="no MPI in this build or no ompi-server")
def test_a_torchrun_rank_whose_peers_never_come_is_told_so(tmp_path):
    # Rank 0 of 2 alone, as if rank 1 had died before its runtime: the join ends within its bound, naming the count.
    import datetime
    import torch.distributed as dist
    script = tmp_path / "alone.py"
    script.write_text("import torch, stealbatch as sb\n"
                      "from stealbatch import _torchrun\n"
                      "_torchrun.join(0, 2, timeout=3.0)\n")
    port = _free_port()
    env = dict(_torchrun()[1], RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Rank 0 serves the store (torchrun's c10d rendezvous): torch 2's store waits for the other rank itself, torch
    # 1.13's does not, and the count of arrivals names it.
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    assert "TimeoutError" in out.stderr, out.stderr
    assert "the other ranks did not all connect" in out.stderr or "1 of 2 ranks arrived" in out.stderr, out.stderr
    # torchrun's agent serves it (static rendezvous): rank 0 gets past the store, and the count of arrivals names it.
    agent = dist.TCPStore("127.0.0.1", port, 2, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    del agent
    assert out.returncode != 0
    assert "TimeoutError" in out.stderr and "1 of 2 ranks arrived" in out.stderr, out.stderr
    # One process under torchrun (WORLD_SIZE 1) runs alone, with no cluster.
    script.write_text("import torch, stealbatch as sb\nsb.Runtime(torch.nn.Linear(2, 2), devices='cpu:1')\n")
    env.update(WORLD_SIZE="1")
    assert subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env).returncode == 0


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
