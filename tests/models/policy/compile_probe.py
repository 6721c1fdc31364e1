"""A start-up in miniature for the compile-cache test, run as its own process:
``python -m tests.models.policy.compile_probe CACHE_DIR``. Loads the cache, compiles a small function
with inductor, saves the cache, and prints one JSON line: whether the cache was loaded, the bytes saved,
inductor's FX-graph cache hits and misses, and the seconds the first call (the compile) took."""

from __future__ import annotations

import json
import sys
import time

import torch
from torch._dynamo.utils import counters

from realtime_gw.models.policy.compile_cache import CompileCache


def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w).softmax(-1) * 2.0 + x


def main() -> None:
    cache = CompileCache(sys.argv[1], "probe")
    loaded = cache.load()
    compiled = torch.compile(step, dynamic=False)
    x, w = torch.randn(4, 16), torch.randn(16, 16)
    t0 = time.perf_counter()
    out = compiled(x, w)
    seconds = time.perf_counter() - t0
    assert torch.allclose(out, step(x, w), atol=1e-5)
    saved = cache.save()
    print(
        json.dumps(
            {
                "loaded": loaded,
                "saved_bytes": saved,
                "hits": counters["inductor"]["fxgraph_cache_hit"],
                "misses": counters["inductor"]["fxgraph_cache_miss"],
                "seconds": round(seconds, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
