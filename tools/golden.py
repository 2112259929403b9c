#!/usr/bin/python3
"""golden.py — writes PyTorch reference fixtures for dtrain's layer kernels.

Run with Debian's python3-torch (PyTorch 1.13):
    /usr/bin/python3 tools/golden.py [OUTDIR]      (default tests/nn/golden)

Each case is one file <layer>_<n>.bin: inputs, parameters, outputs, an
upstream gradient and the gradients of input and parameters, for small odd
shapes (stride 2, padding 0 and 1, batch 1). Inputs are drawn in float32 and
widened, the reference is computed in float64, and everything is stored as
float32 (int32 for integer tensors), so the C side reads exactly the inputs
the reference used.

File format (little-endian):
    char  magic[4] = "DTGF"; u32 version = 1; u32 count
    count x { u32 namelen; char name[namelen]; u32 dtype (0 = f32, 1 = i32);
              u32 ndim; u32 dims[ndim]; data[prod(dims)] (4 bytes each) }
Hyper-parameters travel as an int32 tensor named "meta" (layout per layer,
documented in tests/nn/test_kernels_golden.c).

This script does not check anything; tests/nn/test_kernels_golden.c does.
"""
import os
import struct
import sys

import torch
import torch.nn.functional as F

MAGIC = b"DTGF"
VERSION = 1


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(tensors)))
        for name, t in tensors:
            t = t.detach().cpu().contiguous()
            if t.dtype in (torch.int32, torch.int64):
                dt, arr = 1, t.to(torch.int32)
            else:
                dt, arr = 0, t.to(torch.float32)
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", dt, arr.dim()))
            f.write(struct.pack("<%dI" % arr.dim(), *arr.shape))
            f.write(arr.numpy().astype("<i4" if dt else "<f4").tobytes())


def rnd(*shape, scale=1.0):
    """float32 draw, widened to float64 with grad."""
    return (torch.randn(*shape, dtype=torch.float32) * scale).double().requires_grad_(True)


def meta(*v):
    return torch.tensor(v, dtype=torch.int32)


def grads(out, dout, *xs):
    gs = torch.autograd.grad(out, xs, dout, allow_unused=True)
    return gs


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "nn", "golden")
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(1234)
    files = []

    def emit(name, tensors):
        p = os.path.join(outdir, name + ".bin")
        write(p, tensors)
        files.append(p)

    # linear: meta = B, C, OC, has_bias
    for i, (B, C, OC, hb) in enumerate([(5, 7, 3, 1), (1, 13, 4, 1), (4, 9, 6, 0), (3, 33, 17, 1)]):
        x, w = rnd(B, C), rnd(OC, C, scale=0.3)
        b = rnd(OC) if hb else None
        y = F.linear(x, w, b)
        dy = torch.randn(B, OC).double()
        g = grads(y, dy, x, w, *( [b] if hb else []))
        t = [("meta", meta(B, C, OC, hb)), ("inp", x), ("weight", w)]
        if hb:
            t.append(("bias", b))
        t += [("out", y), ("dout", dy), ("dinp", g[0]), ("dweight", g[1])]
        if hb:
            t.append(("dbias", g[2]))
        emit("linear_%d" % i, t)

    # conv2d: meta = B, C, H, W, OC, KH, KW, stride, pad, has_bias
    conv_cases = [
        (2, 3, 7, 6, 4, 3, 3, 1, 1, 1),
        (3, 2, 9, 8, 5, 3, 3, 2, 0, 1),
        (1, 1, 8, 8, 3, 3, 3, 1, 0, 1),
        (2, 3, 7, 7, 2, 2, 3, 2, 1, 1),
        (2, 4, 5, 5, 3, 1, 1, 1, 0, 0),
        (1, 2, 6, 7, 3, 5, 5, 1, 2, 1),
        (3, 5, 10, 9, 6, 3, 3, 2, 1, 1),
    ]
    for i, (B, C, H, W, OC, KH, KW, s, p, hb) in enumerate(conv_cases):
        x, w = rnd(B, C, H, W), rnd(OC, C, KH, KW, scale=0.3)
        b = rnd(OC) if hb else None
        y = F.conv2d(x, w, b, stride=s, padding=p)
        dy = torch.randn(*y.shape).double()
        g = grads(y, dy, x, w, *([b] if hb else []))
        t = [("meta", meta(B, C, H, W, OC, KH, KW, s, p, hb)), ("inp", x), ("weight", w)]
        if hb:
            t.append(("bias", b))
        t += [("out", y), ("dout", dy), ("dinp", g[0]), ("dweight", g[1])]
        if hb:
            t.append(("dbias", g[2]))
        emit("conv2d_%d" % i, t)

    # pooling: meta = B, C, H, W, k, s
    pool_cases = [(2, 3, 7, 7, 2, 2), (1, 2, 9, 8, 3, 2), (2, 2, 6, 6, 3, 1), (1, 1, 28, 28, 2, 2)]
    for i, (B, C, H, W, k, s) in enumerate(pool_cases):
        x = rnd(B, C, H, W)
        y, idx = F.max_pool2d(x, k, s, return_indices=True)
        dy = torch.randn(*y.shape).double()
        (gx,) = grads(y, dy, x)
        emit("maxpool2d_%d" % i, [("meta", meta(B, C, H, W, k, s)), ("inp", x), ("out", y),
                                  ("argmax", idx), ("dout", dy), ("dinp", gx)])
        x = rnd(B, C, H, W)
        y = F.avg_pool2d(x, k, s)
        dy = torch.randn(*y.shape).double()
        (gx,) = grads(y, dy, x)
        emit("avgpool2d_%d" % i, [("meta", meta(B, C, H, W, k, s)), ("inp", x), ("out", y),
                                  ("dout", dy), ("dinp", gx)])

    # activations: meta = N
    for name, fn in (("relu", F.relu), ("gelu", F.gelu)):
        for i, n in enumerate([51, 7]):
            x = rnd(n, scale=2.0)
            y = fn(x)
            dy = torch.randn(n).double()
            (gx,) = grads(y, dy, x)
            emit("%s_%d" % (name, i), [("meta", meta(n)), ("inp", x), ("out", y), ("dout", dy),
                                       ("dinp", gx)])

    # layernorm: meta = B, D; eps = 1e-5
    for i, (B, D) in enumerate([(4, 10), (1, 33), (3, 128)]):
        x = (rnd(B, D, scale=2.0).detach() + 1.5).requires_grad_(True)
        w, b = (rnd(D, scale=0.5).detach() + 1.0).requires_grad_(True), rnd(D, scale=0.5)
        y = F.layer_norm(x, (D,), w, b, 1e-5)
        dy = torch.randn(B, D).double()
        g = grads(y, dy, x, w, b)
        emit("layernorm_%d" % i, [("meta", meta(B, D)), ("inp", x), ("weight", w), ("bias", b),
                                  ("out", y), ("dout", dy), ("dinp", g[0]), ("dweight", g[1]),
                                  ("dbias", g[2])])

    # batchnorm: meta = B, C, S, train; eps = 1e-5, momentum = 0.1
    for i, (B, C, S, train) in enumerate([(4, 3, 25, 1), (6, 4, 1, 1), (2, 5, 9, 0), (1, 2, 49, 1)]):
        x = (rnd(B, C, S, scale=1.5).detach() - 0.7).requires_grad_(True)
        w, b = (rnd(C, scale=0.5).detach() + 1.0).requires_grad_(True), rnd(C, scale=0.5)
        rm0 = torch.randn(C).double() * 0.3
        rv0 = torch.rand(C).double() + 0.5
        rm, rv = rm0.clone(), rv0.clone()
        y = F.batch_norm(x, rm, rv, w, b, training=bool(train), momentum=0.1, eps=1e-5)
        dy = torch.randn(B, C, S).double()
        g = grads(y, dy, x, w, b)
        emit("batchnorm_%d" % i, [("meta", meta(B, C, S, train)), ("inp", x), ("weight", w),
                                  ("bias", b), ("running_mean0", rm0), ("running_var0", rv0),
                                  ("out", y), ("running_mean", rm), ("running_var", rv),
                                  ("dout", dy), ("dinp", g[0]), ("dweight", g[1]),
                                  ("dbias", g[2])])

    # softmax cross-entropy: meta = B, V; loss is a 1-element tensor
    for i, (B, V) in enumerate([(5, 10), (1, 7), (64, 10)]):
        x = rnd(B, V, scale=3.0)
        t = torch.randint(0, V, (B,))
        loss = F.cross_entropy(x, t)
        (gx,) = torch.autograd.grad(loss, x)
        ncorrect = int((x.argmax(1) == t).sum())
        emit("xent_%d" % i, [("meta", meta(B, V, ncorrect)), ("logits", x), ("targets", t),
                             ("loss", loss.reshape(1)), ("dlogits", gx)])

    total = sum(os.path.getsize(p) for p in files)
    # embedding: meta = N, V, D (own generator: the fixtures above keep their bytes)
    gen = torch.Generator().manual_seed(4321)
    for i, (N, V, D) in enumerate([(6, 5, 3), (9, 4, 7), (1, 11, 2), (12, 3, 4)]):
        w = (torch.randn(V, D, generator=gen, dtype=torch.float32)).double().requires_grad_(True)
        idx = torch.randint(0, V, (N,), generator=gen)
        y = F.embedding(idx, w)
        dy = torch.randn(N, D, generator=gen).double()
        g = grads(y, dy, w)
        emit("embedding_%d" % i, [("meta", meta(N, V, D)), ("idx", idx.to(torch.int32)),
                                  ("weight", w), ("out", y), ("dout", dy), ("dweight", g[0])])

    print("wrote %d fixtures, %d bytes, to %s" % (len(files), total, os.path.normpath(outdir)))


if __name__ == "__main__":
    main()
