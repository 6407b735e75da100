#!/usr/bin/env bash
# Run the gateway in front of the simulated demo fleet (conf/demo.yaml): port 8080, admin 9090.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec cargo run --release -- run --config conf/demo.yaml "$@"
