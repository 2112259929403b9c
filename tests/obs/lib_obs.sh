# lib_obs.sh — what the observability shell tests share (sourced after
# tests/cli/lib.sh): scraping an endpoint, starting a real Prometheus that
# scrapes one target every second, reading a rank's pid from its page, and
# stopping a job by pid.

# scrape PORT FILE: GET /metrics over bash's /dev/tcp; the answer in
# FILE.http, its body in FILE
scrape() {
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  cat <&3 >"$2.http"
  exec 3<&-
  sed '1,/^\r$/d' "$2.http" >"$2"
}

# prom_start TARGET_PORT PROM_PORT: Prometheus on 127.0.0.1:PROM_PORT (data
# and config under $T) scraping 127.0.0.1:TARGET_PORT every second with
# honor_labels; sets $PR and adds it to $PIDS
prom_start() {
  cat >"$T/prom.yml" <<EOC
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dtrain
    honor_labels: true
    static_configs:
      - targets: ['127.0.0.1:$1']
EOC
  prometheus --config.file="$T/prom.yml" --storage.tsdb.path="$T/tsdb" \
    --web.listen-address="127.0.0.1:$2" --log.level=warn >"$T/prom.log" 2>&1 &
  PR=$!
  PIDS="$PIDS $PR"
}

# the pid a rank's page (DIR/obs/rank-R) names: bytes 16-19 (obs_file.h)
page_pid() { od -An -t d4 -j 16 -N 4 "$1" 2>/dev/null | tr -d ' '; }

# stop_job PID: TERM, KILL after 10 s, reaped
stop_job() {
  kill -TERM "$1" 2>/dev/null
  local t=0
  while kill -0 "$1" 2>/dev/null && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
