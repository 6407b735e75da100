#!/usr/bin/env bash
# Run every test: unit, property, integration (real gateway + simulated nodes on 127.0.0.1),
# the official Python SDKs against the gateway, a real Prometheus scraping a test gateway,
# real llama.cpp servers with a real model in front of which the gateway routes, and the fleet
# page in headless chromium. Installs what it needs first (scripts/bootstrap.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --sdks --prometheus --llamacpp --browser
export FLEETGATE_TEST_PYTHON="$PWD/.venv/bin/python"
export FLEETGATE_LLAMACPP_HOME="${FLEETGATE_LLAMACPP_HOME:-$PWD/.cache/llamacpp}"
# Each test in its own process (nextest): the metrics registry is process-wide, and tests
# that count what a gateway exported (observability, http_edges, first_scrape) would count
# their neighbours' requests under plain `cargo test` (4 failed that way in stop 23).
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "test.sh: installing cargo-nextest (tests run one process each)" >&2
  cargo install --locked cargo-nextest
fi
cargo nextest run --all-targets --no-fail-fast "$@"
cargo test --doc -q
