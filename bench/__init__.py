"""convmem's benchmark harness (not a test): ``python -m bench [--smoke] [--only NAME,...] [--out DIR]``.

Every measure runs convmem beside its reference in the same run, so a noisy
machine slows both alike; the run prints a side-by-side table and writes the
figures as JSON (``bench/out/results-<timestamp>.json`` and ``latest.json``).
See ``bench/README.md`` for what each measure does and ``bench/RESULTS.md``
for a recorded run.
"""
