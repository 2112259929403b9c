#!/usr/bin/python3
"""ratings_bound.py -- how close to the floor any factorisation can get on a
ratings set of tools/gen_ratings.py (docs/ps.md "How close a model gets").

  /usr/bin/python3 tools/gen_ratings.py --users 20000 --items 10000 --ratings 2000000 --truth --out D
  /usr/bin/python3 tools/ratings_bound.py D [--sweeps 30]

Reads the set and its hidden vectors (--truth) and prints the test RMSE,
and its ratio to meta.json's rmse_floor, of:
  - the Bayes predictor with the true vectors (the floor, as realised on
    this test set);
  - two oracles: the item vectors known exactly and each user's vector its
    posterior mean given the user's training ratings (a Gaussian prior of
    the generator's variance, a Gaussian likelihood of the stars' residual
    variance around the true score), the prediction E[star] over the
    posterior; and the same with the users known. An estimator that knows
    neither side's vectors has the first oracle's error and more: it is
    (up to the Gaussian likelihood standing in for the rounded, clamped
    one) a lower bound;
  - ALS at the generator's rank with the ridge of that prior (the MAP
    estimate), 20 alternations;
  - Bayesian matrix factorisation by Gibbs sampling with the true prior,
    the posterior predictive mean of the star over the samples after a
    third of the sweeps (the best estimate under that model).
numpy only; ~1-2 min per stage for 2M ratings on a quiet core.
"""
import argparse, json, math, os, time
import numpy as np

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("dir")
ap.add_argument("--sweeps", type=int, default=30, help="Gibbs sweeps (0: no BPMF)")
ap.add_argument("--als", type=int, default=20, help="ALS alternations (0: no ALS)")
ap.add_argument("--seed", type=int, default=11)
a = ap.parse_args()
meta = json.load(open(os.path.join(a.dir, "meta.json")))
U = np.load(os.path.join(a.dir, "user_vectors.npy")).astype(np.float64)
V = np.load(os.path.join(a.dir, "item_vectors.npy")).astype(np.float64)
users, items, rank, noise = meta["users"], meta["items"], meta["rank"], meta["noise"]
def load(x, y):
    xs = np.load(os.path.join(a.dir, x)).astype(np.int64)
    return xs[:, 0], xs[:, 1] - users, np.load(os.path.join(a.dir, y)).astype(np.float64)
u, i, r = load("train_x.npy", "train_y.npy")
ut, it, rt = load("test_x.npy", "test_y.npy")
st = 3.0 + np.einsum("ij,ij->i", U[ut], V[it])
floor = meta["rmse_floor"]
erf = np.vectorize(math.erf)
edges = np.array([1.5, 2.5, 3.5, 4.5])
def estar(mu, var):
    """E[star] when the score is N(mu, var): star = round(score + N(0, noise^2)) in 1..5"""
    sdv = np.sqrt(var + noise ** 2)
    c = 0.5 * (1 + erf((edges[None, :] - mu[:, None]) / (sdv[:, None] * math.sqrt(2))))
    p = np.diff(np.concatenate([np.zeros((len(mu), 1)), c, np.ones((len(mu), 1))], 1), axis=1)
    return p @ np.arange(1, 6)
def report(name, pred):
    e = float(np.sqrt(((rt - pred) ** 2).mean()))
    print(f"{name}: test RMSE {e:.4f} = {e / floor:.3f}x the floor {floor:.4f}", flush=True)
print(f"{users} users x {items} items, rank {rank}, {len(r)} training ratings "
      f"({len(r) / users:.0f} per user, {len(r) / items:.0f} per item), {len(rt)} test")
report("Bayes predictor, true vectors (the floor as realised)", estar(st, np.zeros(len(st))))
prior = rank ** -0.5
se2 = float((r - 3.0 - np.einsum("ij,ij->i", U[u], V[i])).var())
print(f"residual variance of the training stars around the true score {se2:.4f}; prior variance "
      f"per entry {prior:.4f}")
def gram(idx, W, cnt):
    outer = (W[:, :, None] * W[:, None, :]).reshape(len(W), -1)
    return np.stack([np.bincount(idx, outer[:, k], cnt) for k in range(rank * rank)], 1).reshape(cnt, rank, rank)
def post(idx, W, y, cnt):
    """each row's Gaussian posterior: mean and precision"""
    A = gram(idx, W, cnt) / se2 + np.eye(rank) / prior
    b = np.stack([np.bincount(idx, W[:, k] * y, cnt) for k in range(rank)], 1) / se2
    return np.linalg.solve(A, b[..., None])[..., 0], A
def quad(X, Ainv, Y):
    return np.einsum("ij,ijk,ik->i", X, Ainv, Y)
mu, A = post(u, V[i], r - 3, users)
report("oracle: item vectors known, users' posterior",
       estar(3 + np.einsum("ij,ij->i", mu[ut], V[it]), quad(V[it], np.linalg.inv(A)[ut], V[it])))
mu, A = post(i, U[u], r - 3, items)
report("oracle: user vectors known, items' posterior",
       estar(3 + np.einsum("ij,ij->i", U[ut], mu[it]), quad(U[ut], np.linalg.inv(A)[it], U[ut])))
g = np.random.default_rng(a.seed)
sd = math.sqrt(prior)
if a.als:
    P = g.normal(0, sd, (users, rank)); Q = g.normal(0, sd, (items, rank))
    for _ in range(a.als):
        P, Au = post(u, Q[i], r - 3, users)
        Q, Ai = post(i, P[u], r - 3, items)
    m = 3 + np.einsum("ij,ij->i", P[ut], Q[it])
    report(f"ALS rank {rank} (MAP, ridge of the prior), clipped to 1..5", np.clip(m, 1, 5))
if a.sweeps:
    P = g.normal(0, sd, (users, rank)); Q = g.normal(0, sd, (items, rank))
    acc = np.zeros(len(rt)); k = 0
    def sample(idx, W, y, cnt):
        mu, A = post(idx, W, y, cnt)
        L = np.linalg.cholesky(A)
        z = g.normal(size=(cnt, rank, 1))
        return mu + np.linalg.solve(np.transpose(L, (0, 2, 1)), z)[..., 0]
    for sw in range(a.sweeps):
        P = sample(u, Q[i], r - 3, users); Q = sample(i, P[u], r - 3, items)
        if sw >= a.sweeps // 3:
            acc += estar(3 + np.einsum("ij,ij->i", P[ut], Q[it]), np.zeros(len(rt))); k += 1
    report(f"BPMF (Gibbs, true prior, {a.sweeps} sweeps, {k} samples averaged)", acc / k)
