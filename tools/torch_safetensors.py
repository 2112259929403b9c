#!/usr/bin/python3
"""torch_safetensors.py — dtrain's weights in and out of PyTorch 1.13.

Debian has no safetensors package for Python; the format is simple enough
to read and write with json and torch.frombuffer: an 8-byte little-endian
header length N, N bytes of JSON ({"name": {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}), then the raw
little-endian tensor bytes.

The model is the nn.Sequential of dtrain's layer spec (metadata
"dtrain.layers", input shape "dtrain.input"): layer i of the spec is
module i, so the state_dict names are dtrain's tensor names ("1.weight",
"3.running_mean", ...) and load without renaming.

    torch_safetensors.py eval MODEL.safetensors [--data DIR] [--limit N]
        test-set accuracy and loss of the weights (dtrain export writes
        them), inputs normalised with the metadata's mean and std
    torch_safetensors.py init --layers SPEC --input C,H,W --seed S --out FILE
        PyTorch's own initialisation of that model, written for
        `dtrain train --set model.init=FILE`
    torch_safetensors.py first-loss FILE --limit N [--data DIR]
        the loss of the first training batch (the first N training samples,
        unshuffled, normalised with their own mean and std, as dtrain does
        with data.limit_train = N) on FILE's weights
    torch_safetensors.py save-bench FILE --out OUT
        torch.save of FILE's tensors plus optimizer-sized state (bench)

It checks nothing itself: tests/ckpt/test_ckpt_torch.sh compares its
numbers with dtrain's.
"""
import argparse
import gzip
import json
import os
import re
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "U8": torch.uint8}
NAMES = {v: k for k, v in DTYPES.items()}
FASHION = "/usr/share/datasets/fashion-mnist"


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode())
    meta = header.pop("__metadata__", {})
    data = memoryview(raw)[8 + n:]
    tensors = {}
    for name, d in header.items():
        b, e = d["data_offsets"]
        dt = DTYPES[d["dtype"]]
        if e > b:
            t = torch.frombuffer(bytearray(data[b:e]), dtype=dt)
        else:
            t = torch.zeros(0, dtype=dt)
        tensors[name] = t.reshape(d["shape"])
    return tensors, meta


def write(path, tensors, meta):
    header, blobs, off = {}, [], 0
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    for name, t in tensors.items():
        b = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def build(spec, c, h, w):
    """nn.Sequential for dtrain's spec on (c, h, w) inputs."""
    mods, shape = [], (c, h, w)
    for tok in re.findall(r"[a-z]+(?:\([^)]*\))?", spec):
        name, _, args = tok.partition("(")
        args = args.rstrip(")")
        pos = [a for a in args.split(",") if a and "=" not in a]
        kw = dict(a.split("=") for a in args.split(",") if "=" in a)
        flat = len(shape) == 1
        if name == "linear":
            n_in = shape[0] if flat else shape[0] * shape[1] * shape[2]
            mods.append(nn.Linear(n_in, int(pos[0])))
            shape = (int(pos[0]),)
        elif name == "conv":
            oc, k = int(pos[0]), int(pos[1])
            s, p = int(kw.get("stride", 1)), int(kw.get("pad", 0))
            mods.append(nn.Conv2d(shape[0], oc, k, stride=s, padding=p))
            shape = (oc, (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1)
        elif name in ("maxpool", "avgpool"):
            k = int(pos[0])
            s = int(kw.get("stride", k))
            mods.append((nn.MaxPool2d if name == "maxpool" else nn.AvgPool2d)(k, stride=s))
            shape = (shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1)
        elif name == "relu":
            mods.append(nn.ReLU())
        elif name == "gelu":
            mods.append(nn.GELU())
        elif name == "dropout":
            mods.append(nn.Dropout(float(pos[0])))
        elif name == "flatten":
            mods.append(nn.Flatten())
            shape = (shape[0] * shape[1] * shape[2],) if not flat else shape
        elif name == "layernorm":
            mods.append(nn.LayerNorm(list(shape)))
        elif name == "batchnorm":
            mods.append(nn.BatchNorm1d(shape[0]) if flat else nn.BatchNorm2d(shape[0]))
        else:
            raise SystemExit("torch_safetensors.py: unknown layer '%s' in '%s'" % (tok, spec))
    return nn.Sequential(*mods)


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    (magic,) = struct.unpack(">I", raw[:4])
    nd = magic & 0xff
    dims = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
    t = torch.frombuffer(bytearray(raw[4 + 4 * nd:]), dtype=torch.uint8)
    return t.reshape(dims)


def load_split(data, split, limit, c, h, w):
    pre = "train" if split == "train" else "t10k"
    x = idx(os.path.join(data, pre + "-images-idx3-ubyte.gz"))
    y = idx(os.path.join(data, pre + "-labels-idx1-ubyte.gz"))
    if limit:
        x, y = x[:limit], y[:limit]
    x = x.to(torch.float32) / 255.0
    return x.reshape(-1, c, h, w), y.to(torch.int64)


def model_of(path):
    tensors, meta = read(path)
    c, h, w = (int(v) for v in meta["dtrain.input"].split(","))
    m = build(meta["dtrain.layers"], c, h, w)
    sd = m.state_dict()
    for k in list(tensors):
        if k.endswith("num_batches_tracked") and k not in sd:
            del tensors[k]
    m.load_state_dict(tensors, strict=True)
    return m, meta, (c, h, w)


def cmd_eval(a):
    torch.set_num_threads(1)
    m, meta, (c, h, w) = model_of(a.file)
    m.eval()
    x, y = load_split(a.data, "test", a.limit, c, h, w)
    mean, std = float(meta["dtrain.normalize_mean"]), float(meta["dtrain.normalize_std"])
    x = (x - torch.tensor(mean, dtype=torch.float32)) / torch.tensor(std, dtype=torch.float32)
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), 500):
            out = m(x[i:i + 500])
            loss += F.cross_entropy(out, y[i:i + 500], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + 500]).sum().item()
    print("accuracy %.6f loss %.6f samples %d" % (correct / len(x), loss / len(x), len(x)))


def cmd_init(a):
    torch.manual_seed(a.seed)
    c, h, w = (int(v) for v in a.input.split(","))
    m = build(a.layers, c, h, w)
    meta = {"format": "pt", "dtrain.layers": a.layers, "dtrain.input": a.input,
            "written_by": "tools/torch_safetensors.py (PyTorch %s)" % torch.__version__}
    write(a.out, dict(m.state_dict()), meta)
    print("wrote %s: %d tensors" % (a.out, len(m.state_dict())))


def cmd_first_loss(a):
    torch.set_num_threads(1)
    m, meta, (c, h, w) = model_of(a.file)
    m.train()
    x, y = load_split(a.data, "train", a.limit, c, h, w)
    xd = x.double()
    mean = xd.mean()
    std = ((xd - mean) ** 2).mean().sqrt()
    x = (x - mean.float()) / std.float()
    with torch.no_grad():
        loss = F.cross_entropy(m(x[:a.batch]), y[:a.batch]).item()
    print("loss %.9f" % loss)


def cmd_save_bench(a):
    """torch.save of the same tensors plus `moments` optimizer-sized tensors each, timed."""
    import time
    tensors, _ = read(a.file)
    state = {"model": tensors,
             "optim": {k: [torch.zeros_like(v) for _ in range(a.moments)]
                       for k, v in tensors.items() if v.dtype == torch.float32}}
    t0, c0 = time.time(), time.process_time()
    with open(a.out, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    dt, cpu = time.time() - t0, time.process_time() - c0
    size = os.path.getsize(a.out)
    print("torch.save %d bytes in %.3f s; %.3f s of CPU (%.0f MB/s per CPU second): %.1f MB/s"
          % (size, dt, cpu, size / max(cpu, 1e-9) / 1e6, size / dt / 1e6))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("file")
    e.add_argument("--data", default=FASHION)
    e.add_argument("--limit", type=int, default=0)
    i = sub.add_parser("init")
    i.add_argument("--layers", required=True)
    i.add_argument("--input", default="1,28,28")
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--out", required=True)
    f = sub.add_parser("first-loss")
    f.add_argument("file")
    f.add_argument("--data", default=FASHION)
    f.add_argument("--limit", type=int, required=True)
    f.add_argument("--batch", type=int, default=64)
    s = sub.add_parser("save-bench")
    s.add_argument("file")
    s.add_argument("--out", required=True)
    s.add_argument("--moments", type=int, default=1)
    a = p.parse_args()
    {"eval": cmd_eval, "init": cmd_init, "first-loss": cmd_first_loss,
     "save-bench": cmd_save_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
