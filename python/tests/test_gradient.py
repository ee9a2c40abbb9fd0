"""The gradient through the package against plain PyTorch's, on one device and with stealing."""
import pytest
import torch

import stealbatch as sb
from conftest import mlp, mlp_data, summed_cross_entropy


def reference_gradient(model, x, y):
    ref = mlp()
    ref.load_state_dict(model.state_dict())
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in ref.parameters()])


@pytest.mark.parametrize("devices,chunk", [("cpu:1", 0), ("cpu:1", 16), ("cpu:2", 16), ("sim:1,0.25", 8)])
def test_the_gradient_is_plain_pytorchs(devices, chunk):
    model = mlp()
    x, y = mlp_data()
    rt = sb.Runtime(model, devices=devices, chunk_size=chunk)
    report = rt.compute_gradient(torch.arange(x.shape[0]), summed_cross_entropy, data=(x, y))
    assert report.samples == x.shape[0]
    assert sum(d.samples for d in report.devices) == x.shape[0]
    g, want = rt.gradient(), reference_gradient(model, x, y)
    assert g.shape == want.shape
    assert (g - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert report.loss == pytest.approx(torch.nn.functional.cross_entropy(model(x), y).item(), rel=1e-5)


def test_a_step_is_plain_pytorchs_sgd_step():
    # The runtime's SGD (lr 0.1, momentum 0.9) against torch.optim.SGD's on the same batches: 5 steps.
    model, ref = mlp(), mlp()
    x, y = mlp_data()
    rt = sb.Runtime(model, devices="cpu:2", optimizer="sgd", lr=0.1, momentum=0.9, chunk_size=32)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(5):
        ids = torch.arange(step * 64, step * 64 + 128) % x.shape[0]
        rt.step(ids, summed_cross_entropy, data=(x, y))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[ids]), y[ids]).backward()
        opt.step()
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    assert (rt.parameters() - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    # copy_to() writes the trained values into the module given at construction.
    trained = rt.copy_to()
    assert trained is model
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), rt.parameters())
    assert set(rt.state_dict()) == {n for n, _ in model.named_parameters()}


def test_the_loss_may_read_sample_ids_and_costs_place_the_batch():
    # Without data=, the loss gets the chunk's sample ids; with cost=, the batch is cut and placed by cost.
    model = mlp()
    x, y = mlp_data()
    rt = sb.Runtime(model, devices="cpu:2", chunk_size=16)
    cost = 1.0 + (torch.arange(x.shape[0]) % 7).double()
    rt.compute_gradient(list(range(x.shape[0])), lambda m, ids: summed_cross_entropy(m, x[ids], y[ids]), cost=cost)
    want = reference_gradient(model, x, y)
    assert (rt.gradient() - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_deterministic_mode_gives_the_same_bytes_on_any_devices():
    # Cells' gradients rounded to fixed point: the parameters after 4 steps are the same bytes on cpu:1, cpu:2 and
    # simulated devices of unequal speeds, static or stealing.
    x, y = mlp_data()
    results = []
    for devices, policy in (("cpu:1", "steal"), ("cpu:2", "steal"), ("cpu:2", "static"), ("sim:1,0.3,2", "steal")):
        rt = sb.Runtime(mlp(), devices=devices, policy=policy, deterministic=True, chunk_size=16)
        for step in range(4):
            rt.step(torch.arange(step * 32, step * 32 + 256) % 512, summed_cross_entropy, data=(x, y))
        results.append(rt.parameters())
    for r in results[1:]:
        assert torch.equal(r, results[0])


def test_buffers_are_each_replicas_own_and_come_back_with_the_parameters():
    # BatchNorm's running statistics: each replica's own, device 0's written back by copy_to() and given by
    # state_dict(), which the module loads strictly.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    x, y = mlp_data()
    rt = sb.Runtime(model, devices="cpu:1", chunk_size=64)
    before = model[1].running_mean.clone()
    rt.step(torch.arange(256), summed_cross_entropy, data=(x, y))
    state = rt.state_dict()
    assert "1.running_mean" in state and "1.num_batches_tracked" in state
    assert not torch.equal(state["1.running_mean"], before)  # the replica's statistics moved
    assert torch.equal(model[1].running_mean, before)  # the user's module is untouched until copy_to()
    rt.copy_to()
    assert torch.equal(model[1].running_mean, state["1.running_mean"])
    model.load_state_dict(state, strict=True)
