"""Checkpoints cross between Python and C++: written by the package and resumed by a C++ runtime, and the reverse."""
import subprocess

import torch

import stealbatch as sb
from conftest import Affine, affine_data, affine_loss


def peer(binary, *args):
    out = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = lines.index("params")
    meta = dict(line[5:].split("=", 1) for line in lines[:at] if line.startswith("meta "))
    return torch.tensor([float(v) for v in lines[at + 1:]], dtype=torch.float32), meta


def runtime():
    # checkpoint_peer's settings: cpu:1, chunks of 8, SGD lr 0.05, momentum 0.9.
    return sb.Runtime(Affine(), devices="cpu:1", chunk_size=8, optimizer="sgd", lr=0.05, momentum=0.9)


def train(rt, steps):
    x, y = affine_data()
    for _ in range(steps):
        rt.step(torch.arange(32), affine_loss, data=(x, y))


def test_written_in_python_resumed_in_cpp(tmp_path, checkpoint_peer):
    rt = runtime()
    train(rt, 3)
    path = tmp_path / "py.safetensors"
    rt.save_checkpoint(path, {"from": "python"})
    loaded, meta = peer(checkpoint_peer, "read", path, 0)
    assert meta == {"from": "python"}
    assert torch.equal(loaded, rt.parameters())  # the same bits
    resumed, _ = peer(checkpoint_peer, "read", path, 2)  # and the momentum with them: two more steps agree
    train(rt, 2)
    assert (resumed - rt.parameters()).abs().max().item() <= 1e-6


def test_written_in_cpp_resumed_in_python(tmp_path, checkpoint_peer):
    path = tmp_path / "cpp.safetensors"
    written, _ = peer(checkpoint_peer, "write", path, 3)
    rt = runtime()
    assert rt.load_checkpoint(path) == {"from": "c++"}
    assert torch.equal(rt.parameters(), written)
    train(rt, 2)
    again = runtime()
    train(again, 5)  # five steps in Python alone: the resumed run is the same run
    assert (rt.parameters() - again.parameters()).abs().max().item() <= 1e-6
    cpp_five, _ = peer(checkpoint_peer, "write", tmp_path / "five.safetensors", 5)
    assert (rt.parameters() - cpp_five).abs().max().item() <= 1e-6
