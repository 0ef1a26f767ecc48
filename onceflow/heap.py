"""The cyclic garbage collector's settings for a long-running service process.

Done once the process has loaded what it keeps for its whole life:

- ``gc.freeze()`` moves that (modules, the app, its models, pools) out of the
  collector's generations, so a full pass scans only what requests and runs make
  (the engine's full passes took ~45 ms over the loaded heap, ~11 ms frozen;
  BENCHMARKS.md, "A cycle per workflow").
- Optionally, the young generation is collected every ``young_threshold`` allocations
  instead of Python's 700. Ingest does (:data:`INGEST_YOUNG_THRESHOLD`): almost all a
  request makes is freed by its reference count, yet at 700 the collector ran ~900
  times a second under batches of 100 and scanned the records waiting for Kafka's
  reports again and again; 50,000 gave batches 10% more jobs/s (BENCHMARKS.md,
  "Batches: where the time goes"). What it still collects are reference cycles,
  which wait a little longer. The engine keeps Python's threshold: the same change
  showed no gain there, within the noise of its bench.
"""

from __future__ import annotations

import gc

#: Ingest's young-generation threshold: container allocations (net of frees) between
#: two young passes.
INGEST_YOUNG_THRESHOLD = 50_000


def settle_heap(young_threshold: int | None = None) -> None:
    """Collect and freeze what is loaded; with ``young_threshold``, collect the young
    generation that much less often."""
    gc.collect()
    gc.freeze()
    if young_threshold is not None:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
