# Peer for `make bench`: PyTorch 1.13 (Debian python3-torch) training on Fashion-MNIST, CPU,
# copied from the shared reference. Usage: fmnist.py --model mlp|cnn --epochs N --batch B --threads T
import argparse, gzip, time, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
D = "/usr/share/datasets/fashion-mnist/"
def idx(path):
    with gzip.open(D + path) as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4*i: 8 + 4*i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4*ndim).reshape(dims)
ap = argparse.ArgumentParser()
ap.add_argument("--model", default="mlp"); ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--batch", type=int, default=64); ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--lr", type=float, default=0.05)
a = ap.parse_args()
torch.set_num_threads(a.threads); torch.manual_seed(0)
xtr = torch.tensor(idx("train-images-idx3-ubyte.gz"), dtype=torch.float32).div_(255).view(-1, 1, 28, 28)
ytr = torch.tensor(idx("train-labels-idx1-ubyte.gz"), dtype=torch.long)
xte = torch.tensor(idx("t10k-images-idx3-ubyte.gz"), dtype=torch.float32).div_(255).view(-1, 1, 28, 28)
yte = torch.tensor(idx("t10k-labels-idx1-ubyte.gz"), dtype=torch.long)
if a.model == "mlp":
    m = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
else:
    m = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(64*7*7, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9)
n = xtr.shape[0]
for ep in range(a.epochs):
    perm = torch.randperm(n); t0 = time.perf_counter(); m.train()
    for i in range(0, n - a.batch + 1, a.batch):
        idxs = perm[i:i+a.batch]
        loss = F.cross_entropy(m(xtr[idxs]), ytr[idxs])
        opt.zero_grad(); loss.backward(); opt.step()
    dt = time.perf_counter() - t0
    m.eval()
    with torch.no_grad():
        acc = (m(xte).argmax(1) == yte).float().mean().item()
    print(f"epoch {ep+1} model {a.model} threads {a.threads} batch {a.batch} train_s {dt:.2f} samples_per_s {n/dt:.0f} test_acc {acc:.4f} loss {loss.item():.4f}", flush=True)
