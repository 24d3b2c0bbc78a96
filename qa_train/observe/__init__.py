"""What a run measures and records: throughput, memory, metrics.json, trackers, progress."""
