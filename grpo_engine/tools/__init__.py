"""Commands beside training: the step benchmark, the demo's seed check, parallel memory, evaluation, the packing benchmark."""
