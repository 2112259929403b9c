#!/usr/bin/env python3
"""check_visits.py DIR N EPOCHS [partial | slack<=K] — the per-sample visit record of an elastic
run (DTRAIN_TEST_VISITS=DIR: every worker appends "epoch lo hi" for the
positions of the epoch's permutation it trained on in each completed step)
must cover every position 0..N-1 of every epoch exactly once: no sample
skipped, none trained twice, whatever workers were lost or joined. With "partial" (a job that was
stopped) only the second half holds: no sample trained twice. With
"slack<=K" at most K positions in all may lack a record or have two: a
worker cut off or frozen (not killed) in a step records its pieces when it
alone completed the step and the others redo it (its update is lost with
it), or when it completes the step after the others' recovery recorded
its share for it (the source of a new generation records the positions
of the agreed state's last step that no record holds); a cut-off side
that trained on would show far more."""
import os
import sys

d, n, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else ""
partial = mode == "partial"
slack = int(mode[7:]) if mode.startswith("slack<=") else 0
seen = {e: [0] * n for e in range(1, epochs + 1)}
files = [f for f in os.listdir(d) if f.startswith("visits.")]
if not files:
    sys.exit("no visit records in %s" % d)
for f in files:
    with open(os.path.join(d, f)) as fh:
        for line in fh:
            e, lo, hi = (int(x) for x in line.split())
            if e not in seen or not 0 <= lo < hi <= n:
                sys.exit("%s: bad line %r" % (f, line))
            for i in range(lo, hi):
                seen[e][i] += 1
bad = 0
odd = sum(1 for v in seen.values() for c in v if c != 1)
if slack and 0 < odd <= slack and all(c <= 2 for v in seen.values() for c in v):
    print("visits: %d positions recorded 0 or 2 times (allowed: %d)" % (odd, slack))
    sys.exit(0)
for e, v in seen.items():
    miss = [] if partial else [i for i, c in enumerate(v) if c == 0]
    twice = [i for i, c in enumerate(v) if c > 1]
    if miss or twice:
        bad = 1
        print("epoch %d: %d positions skipped (first %s), %d trained more than once (first %s)"
              % (e, len(miss), miss[:5], len(twice), twice[:5]))
if bad:
    sys.exit(1)
print("visits: %d epochs x %d samples, each %s (%d workers' records)"
      % (epochs, n, "at most once" if partial else "exactly once", len(files)))
