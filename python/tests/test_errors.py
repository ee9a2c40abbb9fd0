"""Errors come back as Python exceptions: a chunk's own, with its traceback; the runtime's, naming what was wrong."""
import os
import signal
import subprocess
import sys
import textwrap
import traceback

import pytest
import torch

import stealbatch as sb
from conftest import mlp, mlp_data, summed_cross_entropy


class Boom(Exception):
    pass


def test_a_chunks_exception_comes_back_as_itself_and_the_next_step_runs():
    model = mlp()
    x, y = mlp_data()
    rt = sb.Runtime(model, devices="cpu:2", chunk_size=16)
    before = rt.parameters()

    def failing(m, xb, yb):
        if xb.shape[0] > 0:
            raise Boom("chunk failed on purpose")
        return summed_cross_entropy(m, xb, yb)

    with pytest.raises(Boom, match="chunk failed on purpose") as info:
        rt.step(torch.arange(256), failing, data=(x, y))
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "failing" in frames  # the chunk's own frame, from the device's thread
    assert torch.equal(rt.parameters(), before)  # nothing applied
    report = rt.step(torch.arange(256), summed_cross_entropy, data=(x, y))
    assert report.samples == 256
    assert not torch.equal(rt.parameters(), before)


@pytest.mark.parametrize("kwargs,named", [
    ({"devices": "gpu:7"}, "gpu:7"),
    ({"policy": "fastest"}, "policy"),
    ({"optimizer": "lion"}, "optimizer"),
    ({"lr": -1.0}, "lr"),
    ({"placement": "random"}, "placement"),
    ({"cluster": "ray"}, "cluster"),
    ({"on_device_failure": "retry"}, "on_device_failure"),
    ({"chunk_size": 1 << 24}, "chunk_size"),
    ({"wire": "fp8"}, "wire"),
    ({"wire": "bf16"}, "wire = bf16 without a cluster"),
])
def test_a_bad_argument_is_a_config_error_that_names_it(kwargs, named):
    with pytest.raises(sb.ConfigError, match=named) as info:
        sb.Runtime(mlp(), **kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, sb.Error)


def test_bad_inputs_to_a_step_are_named():
    x, y = mlp_data()
    rt = sb.Runtime(mlp(), devices="cpu:1")
    with pytest.raises(sb.ConfigError, match="samples"):
        rt.step(torch.zeros(4, 4, dtype=torch.long), summed_cross_entropy, data=(x, y))
    with pytest.raises(sb.ConfigError, match="sample id -3"):
        rt.step(torch.tensor([0, 1, -3]), summed_cross_entropy, data=(x, y))
    with pytest.raises(sb.ConfigError, match="cost"):
        rt.step(torch.arange(8), summed_cross_entropy, data=(x, y), cost=[1.0, 2.0])
    with pytest.raises(TypeError, match="one-element tensor"):
        rt.step(torch.arange(8), lambda m, xb, yb: m(xb), data=(x, y))
    with pytest.raises(TypeError, match="callable"):
        rt.step(torch.arange(8), "loss")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        sb.Runtime(lambda x: x)
    with pytest.raises(sb.ConfigError, match="float32"):
        sb.Runtime(torch.nn.Linear(2, 2).double())
    rt.step(torch.arange(8), summed_cross_entropy, data=(x, y))  # still usable


def test_a_corrupt_checkpoint_is_a_checkpoint_error_and_changes_nothing(tmp_path):
    rt = sb.Runtime(mlp(), devices="cpu:1")
    path = tmp_path / "c.safetensors"
    rt.save_checkpoint(path, {"epoch": 3})
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(data))
    before = rt.parameters()
    with pytest.raises(sb.CheckpointError, match="bad.safetensors") as info:
        rt.load_checkpoint(bad)
    assert isinstance(info.value, OSError)
    assert torch.equal(rt.parameters(), before)
    with pytest.raises(sb.CheckpointError):
        rt.load_checkpoint(tmp_path / "missing.safetensors")
    assert rt.load_checkpoint(path) == {"epoch": "3"}


def test_ctrl_c_stops_the_step_and_the_next_one_runs(tmp_path):
    # A script whose chunks are slow gets SIGINT in its second step: rt.step raises KeyboardInterrupt within a second,
    # nothing is applied, and the script's next step runs.
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent("""
        import sys, time, torch
        import stealbatch as sb
        model = torch.nn.Linear(4, 2)
        rt = sb.Runtime(model, devices="cpu:2", chunk_size=4)
        def slow(m, ids):
            time.sleep(0.2)
            return m(torch.ones(len(ids), 4)).sum()
        rt.step(torch.arange(16), lambda m, ids: m(torch.ones(len(ids), 4)).sum())
        before = rt.parameters()
        print("ready", flush=True)
        t0 = time.monotonic()
        try:
            rt.step(torch.arange(400), slow)
            print("not interrupted", flush=True)
            sys.exit(1)
        except KeyboardInterrupt:
            print(f"interrupted after {time.monotonic() - t0:.2f} s", flush=True)
        assert torch.equal(rt.parameters(), before), "an interrupted step changed the parameters"
        r = rt.step(torch.arange(16), lambda m, ids: m(torch.ones(len(ids), 4)).sum())
        print(f"next step ran {r.samples} samples", flush=True)
    """))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert p.stdout.readline().strip() == "ready"
        import time
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "interrupted after" in out and "next step ran 16 samples" in out, out
    seconds = float(out.split("interrupted after ")[1].split(" s")[0])
    assert seconds < 0.5 + 2.0  # the step ends at its chunks' next boundary, not after its 100 chunks (20 s)


def test_a_second_thread_cannot_step_a_runtime_that_is_stepping():
    import threading
    rt = sb.Runtime(torch.nn.Linear(4, 2), devices="cpu:1", chunk_size=4)
    entered, release, results = threading.Event(), threading.Event(), []

    def held(m, ids):
        entered.set()
        assert release.wait(timeout=30)
        return m(torch.ones(len(ids), 4)).sum()

    t = threading.Thread(target=lambda: results.append(rt.step(torch.arange(4), held)))
    t.start()
    try:
        assert entered.wait(timeout=30)
        with pytest.raises(sb.ConfigError, match="another thread is running a step"):
            rt.step(torch.arange(4), lambda m, ids: m(torch.ones(len(ids), 4)).sum())
    finally:
        release.set()
        t.join(timeout=60)
    assert len(results) == 1 and results[0].samples == 4


def test_the_runtime_refuses_calls_from_inside_its_own_step():
    # A loss function that reads the parameters or sets the learning rate mid-step gets a ConfigError, raised from
    # step() as the chunk's exception; nothing is applied, and the runtime runs the next step.
    rt = sb.Runtime(torch.nn.Linear(4, 2), devices="cpu:1", chunk_size=4)
    before = rt.parameters()
    for call in (lambda: rt.parameters(), lambda: setattr(rt, "lr", 0.01), lambda: rt.save_checkpoint("/nonexistent/x")):
        def loss(m, ids, call=call):
            call()
            return m(torch.ones(len(ids), 4)).sum()
        with pytest.raises(sb.ConfigError, match="a step of this runtime is running"):
            rt.step(torch.arange(8), loss)
    assert torch.equal(rt.parameters(), before)
    rt.step(torch.arange(8), lambda m, ids: m(torch.ones(len(ids), 4)).sum())
    assert not torch.equal(rt.parameters(), before)
