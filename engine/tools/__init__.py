"""Engine tools: benchmarks and utilities run as modules."""
