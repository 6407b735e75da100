#!/usr/bin/env bash
# Run the gateway (port 8080, admin 9090) in front of two REAL llama.cpp servers on this
# machine: SmolLM2-135M-Instruct served by llama.cpp's own HTTP server (PyPI xllamacpp), one
# with a 2k window per slot x 4 slots, one with 8k x 2 slots that sleeps (unloads the model)
# after 30 s idle. Installs both once (tests/llamacpp/setup.sh, cached in .cache/llamacpp).
# Ctrl-C stops the gateway and both servers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --llamacpp
home="${FLEETGATE_LLAMACPP_HOME:-$PWD/.cache/llamacpp}"
if [ -f "$home/failed" ]; then
  echo "demo-llamacpp: install failed: $(cat "$home/failed")" >&2
  exit 1
fi
# shellcheck disable=SC1091
. "$home/env"
run="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT INT TERM

start() { # name ctx slots [sleep-idle]
  local name=$1 ctx=$2 slots=$3 sleep=${4:--1}
  mkfifo "$run/$name.in"
  "$PYTHON" tests/llamacpp/serve.py "$MODEL" --ctx "$ctx" --slots "$slots" \
    --sleep-idle "$sleep" < "$run/$name.in" > "$run/$name.out" 2> "$run/$name.log" &
  pids+=($!)
  exec {fd}> "$run/$name.in" # keeps serve.py's stdin open while the demo runs
}
start small 8192 4
start large 16384 2 30
url() {
  for _ in $(seq 600); do
    grep -q '^READY ' "$run/$1.out" 2>/dev/null && { awk '/^READY /{print $2}' "$run/$1.out"; return; }
    sleep 0.1
  done
  echo "demo-llamacpp: server $1 did not start; see $run/$1.log" >&2; exit 1
}
small=$(url small); large=$(url large)
cat > "$run/fleet.yaml" <<YAML
server:
  listen: 127.0.0.1:8080
  admin_listen: 127.0.0.1:9090
health:
  poll_interval_ms: 1000
fleet:
  nodes:
    - { id: small, url: $small, backend: llamacpp }
    - { id: large, url: $large, backend: llamacpp }
YAML
echo "demo-llamacpp: llama.cpp servers small=$small (2k x 4) large=$large (8k x 2, sleeps after 30 s)" >&2
echo "demo-llamacpp: try  curl -s localhost:8080/v1/chat/completions -d '{\"model\":\"smollm2\",\"max_tokens\":32,\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'" >&2
cargo run --release -- run --config "$run/fleet.yaml" "$@"
