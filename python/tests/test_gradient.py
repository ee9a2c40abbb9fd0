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
