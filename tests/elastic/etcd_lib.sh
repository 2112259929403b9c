# etcd_lib.sh — etcd on loopback for the elastic tests (sourced after
# tests/cli/lib.sh): free ports C (clients) and PP (peers), data in
# $T/etcd; start_etcd starts it (pid E), stop_etcd stops it by pid, rng
# sends a v3 range request. Exits 77 with a reason when etcd or curl is
# missing or etcd does not answer within 10 s.
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CHECK="python3 $SRC/tests/elastic/check_visits.py"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
command -v etcd >/dev/null || { echo "SKIP: etcd is not installed (Debian: etcd-server)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed (the test talks to etcd with it)"; exit 77; }

C=$(free_port 127.0.0.1)
PP=$(free_port 127.0.0.1)
start_etcd() {
  etcd --name dt --data-dir "$T/etcd" --listen-client-urls "http://127.0.0.1:$C" \
    --advertise-client-urls "http://127.0.0.1:$C" --listen-peer-urls "http://127.0.0.1:$PP" \
    --initial-advertise-peer-urls "http://127.0.0.1:$PP" --initial-cluster "dt=http://127.0.0.1:$PP" \
    >>"$T/etcd.log" 2>&1 </dev/null &
  E=$!
}
stop_etcd() { kill "$E" 2>/dev/null; wait "$E" 2>/dev/null; }
trap 'stop_etcd; kill_pids; rm -rf "$T"' EXIT
# v3 JSON gateway: rng BODY — a range request's reply
rng() { curl -sf -m 10 -X POST "http://127.0.0.1:$C/v3/kv/range" -d "$1"; }
# etcd_up — until etcd answers (10 s); 1 if it does not
etcd_up() {
  for _ in $(seq 1 200); do
    rng '{"key":"AA=="}' >/dev/null 2>&1 && return 0
    kill -0 "$E" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
start_etcd
etcd_up || { echo "SKIP: etcd did not start: $(tail -2 "$T/etcd.log")"; exit 77; }

# guard SECS 'COMMANDS' — runs COMMANDS (a job's kill) after SECS unless
# unguard comes first; its sleep dies with it (a stray sleep holding the
# test's output open kept ctest waiting 2 minutes after the test ended)
guard() {
  local s=$1 c=$2
  ( trap 'kill $sp 2>/dev/null; exit 0' TERM; sleep "$s" & sp=$!; wait $sp; eval "$c" ) >/dev/null 2>&1 &
  GUARD=$!
}
unguard() { kill "$GUARD" 2>/dev/null; wait "$GUARD" 2>/dev/null; }
