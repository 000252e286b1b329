"""Writes benchmarks/data/traces/long-conversation-synthetic.jsonl: a seeded stand-in for the
production conversation trace issue 26 names (mean prompt ~12k tokens, p99 ~60k, 3.4 req/s;
not a file this project has), so the plan-vs-peak comparison and its tests run from a clone.

Poisson arrivals at 3.4 req/s for 20 minutes; prompts lognormal (median 7,800 tokens, sigma
0.88: mean ~11.5k, p99 ~60k, capped at 126,000 so prompt plus output fit Llama-3.1's 131,072);
outputs lognormal (median 190, sigma 1.1: mean ~350, a tenth under 50 tokens). Same seed, same
file: run it again and `git diff` shows nothing.

Run: .venv/bin/python benchmarks/make_long_conversation.py
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "traces" / "long-conversation-synthetic.jsonl"
RATE_PER_S, SPAN_S, SEED = 3.4, 1200.0, 26
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_CAP = 7800.0, 0.88, 126_000
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_CAP = 190.0, 1.1, 4096


def rows() -> list[tuple[float, int, int]]:
    rng = random.Random(SEED)
    t, out = 0.0, list[tuple[float, int, int]]()
    while True:
        t += rng.expovariate(RATE_PER_S)
        if t >= SPAN_S:
            return out
        prompt = min(PROMPT_CAP, max(16, round(rng.lognormvariate(math.log(PROMPT_MEDIAN), PROMPT_SIGMA))))
        output = min(OUTPUT_CAP, max(1, round(rng.lognormvariate(math.log(OUTPUT_MEDIAN), OUTPUT_SIGMA))))
        out.append((t, prompt, output))


def main() -> None:
    data = rows()
    OUT.write_text(
        "".join(
            json.dumps({"timestamp": round(t * 1000), "input_length": i, "output_length": o}) + "\n" for t, i, o in data
        )
    )
    prompts = sorted(i for _, i, _ in data)
    print(
        f"wrote {OUT.name}: {len(data)} requests, prompt mean {statistics.fmean(prompts):.0f} "
        f"p50 {prompts[len(prompts) // 2]} p99 {prompts[int(0.99 * len(prompts))]}, "
        f"output mean {statistics.fmean(o for *_, o in data):.0f}"
    )


if __name__ == "__main__":
    main()
