#!/usr/bin/env bash
# Install what a fresh machine lacks to build and test fleetgate: cmake (pingora's zlib-ng
# build runs it) and, with --sdks, a Python venv with the official OpenAI, Ollama and
# Anthropic SDKs that the SDK tests drive. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cmake >/dev/null 2>&1; then
  echo "bootstrap: installing cmake" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake >/dev/null
fi

if [ "${1:-}" = "--sdks" ]; then
  if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import openai, ollama, anthropic" 2>/dev/null; then
    echo "bootstrap: creating .venv with the openai, ollama and anthropic SDKs" >&2
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/sdk/requirements.txt
  fi
fi
