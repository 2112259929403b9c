#!/usr/bin/python3
"""golden_step.py — PyTorch reference fixtures for dtrain's model training
step and optimizers (tests/nn/test_model_golden.c, tests/nn/test_optim.c).

Run with Debian's python3-torch (PyTorch 1.13):
    /usr/bin/python3 tools/golden_step.py [OUTDIR]   (default tests/nn/golden)

step_<model>_<optim>.bin: two full training steps (forward, mean softmax
cross-entropy, backward, optimizer step) of the MLP 784-256-128-10 or the
2-conv CNN on a batch of 8 random inputs. The initial parameters are a
hash pattern (pattern() below) the C test recomputes bit for bit, with
PyTorch's init bounds; parameters are flat in state_dict order (weight then
bias, forward layer order), which is dtrain's flat parameter layout. The
reference runs in float64 and is stored as float32. Gradients and updated
parameters are stored at the flat indices `idx` (every element of tensors up
to 2048 elements, an even spread of 2048 of bigger ones) to keep fixtures
small.
  spec    int32 bytes of the dtrain model spec
  meta    int32 [B, c, h, w, kind (0 SGD, 1 AdamW), nesterov, steps]
  hyper   f32 [lr, momentum, dampening, weight_decay, beta1, beta2, eps]
  x       f32 (steps, B, c*h*w);  y int32 (steps, B)
  logits  f32 (B, V) of step 1;  loss f32 (steps);  idx int32 (K)
  grads   f32 (steps, K); params f32 (steps, K) after each step

optim_<name>.bin: the optimizer alone over several steps with a changing
learning rate (as a schedule would give), on a flat float64 vector.
  meta    int32 [kind, nesterov, steps, n]
  hyper   f32 [momentum, dampening, weight_decay, beta1, beta2, eps]
  lr      f32 (steps);  params0 f32 (n);  grads f32 (steps, n)
  params  f32 (steps, n) after each step

File format: tools/golden.py's "DTGF" v1 (its write() is reused).
This script checks nothing itself; the C tests do.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import write  # noqa: E402

MLP_SPEC = "flatten linear(256) relu linear(128) relu linear(10)"
CNN_SPEC = ("conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1,stride=1) relu maxpool(2) "
            "flatten linear(128) relu linear(10)")


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1, stride=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def flat(ts):
    return torch.cat([t.detach().reshape(-1) for t in ts])


def make_opt(kind, params, h):
    lr, mom, damp, wd, b1, b2, eps, nesterov = h
    if kind == 0:
        return torch.optim.SGD(params, lr=lr, momentum=mom, dampening=damp, weight_decay=wd,
                               nesterov=bool(nesterov))
    return torch.optim.AdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)


def spec_tensor(s):
    return torch.tensor(list(s.encode()), dtype=torch.int32)


def pattern(n, bound, salt):
    """Deterministic 'init' both sides compute bit-identically: a 32-bit
    integer hash of (element, tensor number) mapped to U(-bound, bound) in
    double with a single rounding, then rounded to float32. Storing the
    real initial parameters of the CNN would cost megabytes per fixture."""
    M = 0xFFFFFFFF
    i = torch.arange(n, dtype=torch.int64)
    h = ((i + 1) * 0x9E3779B1 + salt * 0x85EBCA77) & M
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & M
    h = h ^ (h >> 12)
    u = (h >> 8).double()
    return ((u * (2.0 / 16777216.0) - 1.0) * bound).float()


def pattern_init(m):
    """Fills every parameter of m with pattern(); bound = 1/sqrt(fan_in) of
    its layer, salt = the tensor's number in state_dict order."""
    salt = 0
    for mod in m:
        if isinstance(mod, nn.Linear):
            fan_in = mod.in_features
        elif isinstance(mod, nn.Conv2d):
            fan_in = mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1]
        else:
            continue
        for p in (mod.weight, mod.bias):
            with torch.no_grad():
                p.copy_(pattern(p.numel(), 1.0 / (fan_in ** 0.5), salt).view_as(p))
            salt += 1


def sample_index(m, per_tensor=2048):
    """Flat indices to store: all of a small tensor, an even spread of a big
    one, so every weight and bias is compared without megabyte fixtures."""
    idx, off = [], 0
    for p in m.parameters():
        n = p.numel()
        if n <= per_tensor:
            idx.append(torch.arange(off, off + n))
        else:
            idx.append(off + torch.linspace(0, n - 1, per_tensor).round().long())
        off += n
    return torch.cat(idx)


def step_case(name, spec, build, kind, h, emit, B=8, steps=2):
    lr, mom, damp, wd, b1, b2, eps, nesterov = h
    m = build()
    pattern_init(m)
    m = m.double()
    idx = sample_index(m)
    opt = make_opt(kind, m.parameters(), h)
    xs = torch.randn(steps, B, 1, 28, 28, dtype=torch.float32)
    ys = torch.randint(0, 10, (steps, B), dtype=torch.int32)
    losses, grads, params, logits0 = [], [], [], None
    for s in range(steps):
        opt.zero_grad()
        logits = m(xs[s].double())
        if s == 0:
            logits0 = logits.detach()
        loss = F.cross_entropy(logits, ys[s].long())
        loss.backward()
        losses.append(loss.detach())
        grads.append(flat(p.grad for p in m.parameters())[idx])
        opt.step()
        params.append(flat(m.parameters())[idx])
    emit(name, [
        ("spec", spec_tensor(spec)),
        ("meta", torch.tensor([B, 1, 28, 28, kind, nesterov, steps], dtype=torch.int32)),
        ("hyper", torch.tensor([lr, mom, damp, wd, b1, b2, eps], dtype=torch.float32)),
        ("x", xs.reshape(steps, B, -1)),
        ("y", ys),
        ("logits", logits0),
        ("loss", torch.stack(losses)),
        ("idx", idx.int()),
        ("grads", torch.stack(grads)),
        ("params", torch.stack(params)),
    ])


def optim_case(name, kind, h, emit, n=101, steps=6):
    lr0, mom, damp, wd, b1, b2, eps, nesterov = h
    p0 = torch.randn(n, dtype=torch.float32)
    gs = torch.randn(steps, n, dtype=torch.float32)
    lrs = torch.tensor([lr0 * f for f in (0.5, 1.0, 1.0, 0.8, 0.5, 0.25)][:steps],
                       dtype=torch.float32)
    p = p0.double().clone().requires_grad_(True)
    opt = make_opt(kind, [p], h)
    out = []
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = float(lrs[s])
        p.grad = gs[s].double().clone()
        opt.step()
        out.append(p.detach().clone())
    emit(name, [
        ("meta", torch.tensor([kind, nesterov, steps, n], dtype=torch.int32)),
        ("hyper", torch.tensor([mom, damp, wd, b1, b2, eps], dtype=torch.float32)),
        ("lr", lrs),
        ("params0", p0),
        ("grads", gs),
        ("params", torch.stack(out)),
    ])


def f32(v):
    """Hyper-parameters as the float32 values the C side will hold."""
    return float(torch.tensor(v, dtype=torch.float32))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "nn", "golden")
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(4321)

    def emit(name, tensors):
        write(os.path.join(outdir, name + ".bin"), tensors)

    # (lr, momentum, dampening, weight_decay, beta1, beta2, eps, nesterov)
    sgd = tuple(map(f32, (0.05, 0.9, 0.0, 5e-4, 0.9, 0.999, 1e-8))) + (0,)
    sgd_nest = tuple(map(f32, (0.05, 0.9, 0.0, 1e-3, 0.9, 0.999, 1e-8))) + (1,)
    adamw = tuple(map(f32, (1e-3, 0.0, 0.0, 0.01, 0.9, 0.999, 1e-8))) + (0,)
    for mname, spec, build in (("mlp", MLP_SPEC, mlp), ("cnn", CNN_SPEC, cnn)):
        step_case("step_%s_sgd" % mname, spec, build, 0, sgd, emit)
        step_case("step_%s_nesterov" % mname, spec, build, 0, sgd_nest, emit)
        step_case("step_%s_adamw" % mname, spec, build, 1, adamw, emit)

    optim_case("optim_sgd_plain", 0, tuple(map(f32, (0.1, 0.0, 0.0, 0.01, 0.9, 0.999, 1e-8))) + (0,), emit)
    optim_case("optim_sgd_momentum", 0, tuple(map(f32, (0.1, 0.9, 0.1, 1e-3, 0.9, 0.999, 1e-8))) + (0,), emit)
    optim_case("optim_sgd_nesterov", 0, tuple(map(f32, (0.1, 0.8, 0.0, 5e-4, 0.9, 0.999, 1e-8))) + (1,), emit)
    optim_case("optim_adamw", 0 + 1, tuple(map(f32, (1e-2, 0.0, 0.0, 0.01, 0.9, 0.999, 1e-8))) + (0,), emit)
    optim_case("optim_adamw_betas", 1, tuple(map(f32, (3e-2, 0.0, 0.0, 0.1, 0.8, 0.99, 1e-6))) + (0,), emit)


if __name__ == "__main__":
    main()
