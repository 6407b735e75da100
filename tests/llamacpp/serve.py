"""Run one real llama.cpp server (xllamacpp's embedded llama-server) on 127.0.0.1.

Usage: serve.py MODEL.gguf --ctx N --slots N [--sleep-idle S] [--alias NAME]
Prints one line `READY http://127.0.0.1:PORT` on stdout once the server answers, then
serves until stdin closes or the process gets SIGTERM/SIGKILL. One CPU thread, a capped
prompt cache, bound to 127.0.0.1 only. The test harness (tests/llamacpp/mod.rs) and
scripts/demo-llamacpp.sh start it.
"""

import argparse
import signal
import sys
import threading
import time
import urllib.request

import xllamacpp as xlc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, required=True, help="total context (split over slots)")
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--sleep-idle", type=int, default=-1)
    ap.add_argument("--alias", default="smollm2")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()

    p = xlc.CommonParams()
    p.model.path = a.model
    p.model_alias = {a.alias}
    p.hostnames = ["127.0.0.1"]
    p.port = a.port
    p.n_ctx = a.ctx
    p.n_parallel = a.slots
    p.kv_unified = False
    p.cpuparams.n_threads = 1
    p.cpuparams_batch.n_threads = 1
    p.n_threads_http = 4
    p.cache_ram_mib = 64
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.endpoint_props = True
    p.sleep_idle_seconds = a.sleep_idle
    p.warmup = False
    p.ui = False

    server = xlc.Server(p)
    base = server.listening_address.rstrip("/")
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if time.monotonic() > deadline:
            print("serve.py: server did not become healthy in 60 s", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"READY {base}", flush=True)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
