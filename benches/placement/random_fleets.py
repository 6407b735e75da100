#!/usr/bin/env python3
"""Random heterogeneous fleets for the placement bench, as hold-outs nobody tuned for.

    python3 benches/placement/random_fleets.py OUT_DIR [COUNT] [SEED] [--ollama-seats]
    FLEETGATE_BENCH_SCENARIOS=OUT_DIR target/release/deps/placement-* --bench --quick

Each scenario draws 2-5 node kinds (1-3 replicas each) with decode 30-400 tokens/s, prefill
1k-50k tokens/s, 1-16 seats, prefix caches of 0-16 prompts, 8-128 GB, and some of three model
sizes (speed falling with size, contexts 8k-128k, loaded while they fit); a mix of 1-3
request classes over models some node has (some with shared system prompts), sometimes
multi-turn chats, sometimes a node slowing down; an arrival rate drawn around what the fleet
can decode. With `--ollama-seats`, node kinds whose sim seed is even keep their seats per
loaded model, as Ollama does (`OLLAMA_NUM_PARALLEL` slots for each model it holds); without
it the sets of earlier stops come out as they did. Standard library only.
"""
import os
import random
import sys

MODELS = [  # name, GB, relative speed, cold load ms per GB
    ("small:3b", 2.0, 1.0),
    ("mid:14b", 9.0, 0.45),
    ("big:70b", 40.0, 0.12),
]


def node_kind(rng, k, ollama_seats=False):
    mem = rng.choice([8, 16, 24, 32, 48, 64, 128])
    seats = rng.choice([1, 2, 2, 4, 4, 8, 12, 16])
    tps = round(rng.uniform(30, 400))
    prefill = round(tps * rng.uniform(10, 120))
    models, used = [], 0.0
    for name, gb, speed in MODELS:
        if gb * 1.1 > mem or rng.random() < 0.35:
            continue
        loaded = used + gb * 1.1 <= mem and rng.random() < 0.8
        used += gb * 1.1 if loaded else 0.0
        ctx = rng.choice([8192, 16384, 32768, 131072])
        models.append(
            f'        - {{ name: "{name}", size_gb: {gb}, context: {ctx}, loaded: {str(loaded).lower()}, '
            f"cold_load_ms: {round(gb * rng.uniform(40, 120))}, speed: {speed} }}"
        )
    if not models:
        name, gb, speed = MODELS[0]
        models.append(
            f'        - {{ name: "{name}", size_gb: {gb}, context: 32768, loaded: true, cold_load_ms: 200, speed: {speed} }}'
        )
    reps = rng.choice([1, 1, 1, 2, 3])
    lines = [f"  - id: n{k}"]
    if reps > 1:
        lines.append(f"    replicas: {reps}")
    sim_seed = rng.randrange(1000)
    lines += [
        "    sim:",
        f"      seed: {sim_seed}",
        f"      seats: {seats}",
        f"      tokens_per_sec: {tps}",
        f"      prefill_tokens_per_sec: {prefill}",
        f"      ttft_ms: {rng.choice([10, 20, 30, 50])}",
        f"      decode_contention: {round(rng.uniform(0, 0.08), 3)}",
        f"      prefix_cache_entries: {rng.choice([0, 2, 4, 8, 16])}",
        f"      memory_gb: {mem}",
        "      reply_tokens: 4096",
    ]
    if ollama_seats and sim_seed % 2 == 0:
        lines.append("      seats_per_model: true")
    lines += ["      models:"] + models
    names = [m.split('"')[1] for m in models]
    speeds = {name: speed for name, _, speed in MODELS}
    # Answers of ~200 tokens it can decode per second, per model it has (for the arrival rate).
    return lines, names, {n: reps * seats * tps * speeds[n] / 200.0 for n in names}


def scenario(rng, i, ollama_seats=False):
    kinds = [node_kind(rng, k, ollama_seats) for k in range(rng.randint(2, 5))]
    served = sorted({m for _, names, _ in kinds for m in names})
    mix, asked = [], set()
    for _ in range(rng.randint(1, 3)):
        m = rng.choice(served)
        asked.add(m)
        lo = rng.choice([50, 100, 300])
        hi = rng.choice([1000, 3000, 6000])
        out = rng.choice([[20, 80], [40, 160], [100, 400]])
        line = f'  - {{ model: "{m}", weight: {rng.randint(1, 5)}, prompt: [{lo}, {hi}], output: {out}'
        if rng.random() < 0.3:
            line += f", system: {{ prompts: {rng.randint(2, 8)}, tokens: {rng.choice([800, 2000])} }}"
        mix.append(line + " }")
    # What the nodes that have the models asked for can decode, each node counted once.
    capacity = sum(max((c.get(m, 0.0) for m in asked), default=0.0) for _, _, c in kinds)
    rate = round(min(30.0, max(1.0, capacity * rng.uniform(0.3, 0.8))), 1)
    out = [
        f"# Random fleet {i} (benches/placement/random_fleets.py).",
        f"name: random-{i}",
        f"about: random fleet {i}",
        f"seed: {rng.randrange(10_000)}",
        "duration_s: 5",
        f"rate_per_s: {rate}",
        "mix:",
    ] + mix
    if rng.random() < 0.3:
        out += [
            "conversations:",
            f"  count: {rng.randint(4, 12)}",
            f"  turns: {rng.randint(3, 6)}",
            f'  model: "{rng.choice(sorted(asked))}"',
            f"  system: {rng.choice([300, 1000, 2000])}",
            "  turn: [30, 300]",
            "  output: [20, 120]",
            "  think_ms: [100, 500]",
            "  start_within_s: 3",
        ]
    out.append("nodes:")
    for lines, _, _ in kinds:
        out += lines
    first = kinds[0]
    if rng.random() < 0.25:
        reps = 2 if "    replicas:" in "\n".join(first[0]) else None
        node = "n0-1" if reps else "n0"
        out += ["events:", f"  - {{ at_s: 2.5, node: {node}, slowdown: {rng.choice([2, 3, 4])} }}"]
    return "\n".join(out) + "\n"


def main():
    args = [a for a in sys.argv[1:] if a != "--ollama-seats"]
    ollama_seats = len(args) < len(sys.argv) - 1
    if not args or args[0].startswith("-"):
        print(__doc__)
        sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
    out_dir = args[0]
    count = int(args[1]) if len(args) > 1 else 8
    rng = random.Random(int(args[2]) if len(args) > 2 else 2026)
    os.makedirs(out_dir, exist_ok=True)
    for i in range(count):
        with open(os.path.join(out_dir, f"r{i}.yaml"), "w") as f:
            f.write(scenario(rng, i, ollama_seats))


if __name__ == "__main__":
    main()
