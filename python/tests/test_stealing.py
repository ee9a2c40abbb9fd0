"""Every sample exactly once under stealing: a device held in its first chunk until another has stolen from it."""
import os
import threading

import pytest
import torch

import stealbatch as sb
from conftest import mlp, mlp_data, summed_cross_entropy


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: the held chunk keeps the only core's turn at Python")
def test_every_sample_runs_exactly_once_while_chunks_are_stolen():
    model = mlp()
    x, y = mlp_data(n=256)
    # Equal shares at every step (placed by measured speed, the device held in the last step would get a share too
    # small to steal from), and no end game (a thief measured slower would leave the held device's chunks to it).
    rt = sb.Runtime(model, devices="cpu:2", chunk_size=8, placement="equal", endgame=False, stall_timeout=60)
    lock = threading.Lock()
    for step in range(4):
        seen, stolen = [], threading.Event()

        def loss_fn(m, ids):
            chunk = ids.tolist()
            with lock:
                seen.extend(chunk)
            me = threading.get_ident()
            if loss_fn.held is None:
                with lock:
                    if loss_fn.held is None:
                        loss_fn.held = me
            # The first device to run a chunk waits (the GIL released) until the other has stolen one of its chunks:
            # a steal is forced, whatever the timing.
            if loss_fn.held == me and not stolen.is_set():
                assert stolen.wait(timeout=30), "no chunk was stolen from the held device within 30 s"
            return summed_cross_entropy(m, x[ids], y[ids])

        loss_fn.held = None

        # The package calls loss_fn(replica, ids); a steal shows in the chunk's home device, seen through a wrapper.
        original = rt._run_chunk

        def run_chunk(c, fn, data):
            if c.home_device != c.device:
                stolen.set()
            return original(c, fn, data)

        rt._run_chunk = run_chunk
        batch = torch.randperm(x.shape[0])[:200]
        report = rt.step(batch, loss_fn)
        rt._run_chunk = original
        assert stolen.is_set(), f"step {step}"
        assert report.steals >= 1
        assert sorted(seen) == sorted(batch.tolist()), f"step {step}: a sample ran twice or never"
        assert sum(d.samples for d in report.devices) == len(batch)
