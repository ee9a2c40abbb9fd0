"""Launched as PyTorch users launch: mpirun's ranks join one job (every rank the same parameters, the gradient of the
whole batch); torchrun's several processes are refused with what to do instead."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import stealbatch as sb

TESTS = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent("""
    import hashlib, sys, torch
    sys.path.insert(0, {tests!r})
    import stealbatch as sb
    from conftest import mlp, mlp_data, summed_cross_entropy
    x, y = mlp_data()
    rank, world, _ = sb.launch_environment()
    rt = sb.Runtime(mlp(), devices="cpu:1", chunk_size=16)  # cluster="auto": mpi under mpirun
    one = sb.Runtime(mlp(), devices="cpu:1", chunk_size=16, cluster="none")
    for s in range(3):
        ids = torch.arange(s * 64, s * 64 + 256) % 512
        r = rt.step(ids, summed_cross_entropy, data=(x, y))
        one.step(ids, summed_cross_entropy, data=(x, y))
    diff = (rt.parameters() - one.parameters()).abs().max().item()
    print(f"rank {{rank}} of {{world}}: ranks {{r.ranks}}, diff {{diff:.3g}}, bytes {{hashlib.sha256(repr(rt.parameters().tolist()).encode()).hexdigest()}}", flush=True)
""")


@pytest.mark.skipif(not sb.has_mpi or shutil.which("mpirun") is None, reason="no MPI in this build or no mpirun")
def test_mpirun_ranks_train_one_model(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT.format(tests=TESTS))
    out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "PYTHONPATH",
                          sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2, out.stdout
    for line in lines:
        assert "of 2: ranks 2," in line
        assert float(line.split("diff ")[1].split(",")[0]) <= 1e-6  # the whole batch's gradient, as one process
    assert lines[0].split("bytes ")[1] == lines[1].split("bytes ")[1]  # every rank the same parameters


def test_torchruns_several_processes_are_refused_with_what_to_do(tmp_path):
    script = tmp_path / "torchrun.py"
    script.write_text("import torch, stealbatch as sb\nsb.Runtime(torch.nn.Linear(2, 2), devices='cpu:1')\n")
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    for k in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    assert "ConfigError" in out.stderr and "rank 1 of 2" in out.stderr and "mpirun" in out.stderr, out.stderr
    # One process under torchrun (WORLD_SIZE 1) runs.
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    assert subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env).returncode == 0
