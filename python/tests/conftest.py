"""What the package's tests share: small modules and their data, and the path of the C++ checkpoint peer."""
import os

import pytest
import torch


class Affine(torch.nn.Module):
    """y = lin(x): the layout of checkpoint_peer.cpp (lin.weight [2, 3], lin.bias [2]) and its start."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))
            self.lin.bias.copy_(torch.tensor([-0.2, 0.3]))

    def forward(self, x):
        return self.lin(x)


def affine_data(n=32):
    """checkpoint_peer.cpp's samples: x = (s % 5 - 2, s % 3 - 1, s % 7 / 4), y = (s % 2, 1 - s % 4 / 2)."""
    s = torch.arange(n)
    x = torch.stack([(s % 5 - 2).float(), (s % 3 - 1).float(), (s % 7).float() * 0.25], dim=1)
    y = torch.stack([(s % 2).float(), 1.0 - (s % 4).float() * 0.5], dim=1)
    return x, y


def affine_loss(m, x, y):
    return 0.5 * ((m(x) - y) ** 2).sum()


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))


def mlp_data(n=512, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 20, generator=g), torch.randint(0, 5, (n,), generator=g)


def summed_cross_entropy(m, x, y):
    return torch.nn.functional.cross_entropy(m(x), y, reduction="sum")


@pytest.fixture
def checkpoint_peer():
    path = os.environ.get("SB_CHECKPOINT_PEER")
    if not path:
        pytest.skip("SB_CHECKPOINT_PEER is not set (CTest sets it to the built checkpoint_peer)")
    return path
