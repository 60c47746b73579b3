"""The pure domain: counters, windows, results, dialects, parsing; no I/O."""
