"""torch_lm's model and data in PyTorch: the byte-level causal transformer (TorchLm), a chunk's documents packed end
to end, the summed next-byte loss, bits per byte, and the runs `torch_lm --export` writes (the settings, the training
documents, each epoch's order, the held-out documents). The Python examples and perf/torch_lm_ref.py share it.

The model is torch_lm's TorchLm: token and position embeddings, pre-norm blocks (causal self-attention within each
document, a 4x GELU MLP), a final norm and a 256-way head, with attention written as torch_lm writes it (matmul,
masked softmax, matmul), documents packed end to end and attended one at a time.
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def attend(self, x):
        b, l, w = x.shape
        dh = w // self.heads
        h = self.qkv(x).view(b, l, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        att = torch.matmul(h[0], h[1].transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        later = torch.ones(l, l, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(later, float("-inf")).softmax(-1)
        return self.proj(torch.matmul(att, h[2]).transpose(1, 2).reshape(b, l, w))

    def forward(self, x, lengths):
        y = self.ln1(x)
        x = x + torch.cat([self.attend(part) for part in y.split(lengths, 1)], 1)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TorchLm(nn.Module):
    def __init__(self, width, layers, heads, max_len):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)

    def forward(self, tokens, positions, lengths):
        x = self.tok(tokens) + self.pos(positions)
        for b in self.blocks:
            x = b(x, lengths)
        return self.head(self.ln(x))


def packed(docs, device="cpu"):
    """The documents end to end, on `device`: tokens, positions, next-byte targets (-100 after each document's last
    byte)."""
    tokens, positions, targets, lengths = [], [], [], []
    for d in docs:
        tokens += d
        positions += range(len(d))
        targets += d[1:] + [-100]
        lengths.append(len(d))
    t = lambda v: torch.tensor([v], dtype=torch.long).to(device, non_blocking=True)
    return t(tokens), t(positions), t(targets), lengths


def summed_loss(model, docs):
    """The documents' summed next-byte loss, on the device that holds the model (its replica's, on stealbatch)."""
    tokens, positions, targets, lengths = packed(docs, next(model.parameters()).device)
    logits = model(tokens, positions, lengths)
    return F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), reduction="sum", ignore_index=-100)


def bits_per_byte(model, docs):
    with torch.no_grad():
        nats = sum(summed_loss(model, docs[i:i + 16]).item() for i in range(0, len(docs), 16))
    return nats / math.log(2) / sum(len(d) - 1 for d in docs)


def cosine_lr(lr, step, total):
    return max(1e-6, lr * 0.5 * (1.0 + math.cos(math.pi * step / total)))


def make_model(run):
    """The run's model, drawn from its seed (libtorch draws the same weights)."""
    torch.manual_seed(run["seed"])
    m = run["model"]
    return TorchLm(m["width"], m["layers"], m["heads"], m["max_len"])


def load_run(path):
    with open(path) as f:
        run = json.load(f)
    if run.get("form") != "packed":
        sys.exit(f"{path} was exported with --form {run.get('form')}; the Python model runs the packed form")
    return run
