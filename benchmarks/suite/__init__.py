"""The pytest-benchmark suite (`pytest benchmarks/suite/ --benchmark-only`): its cases, shapes, inputs and paths,
the runner that times them, and the report that turns their JSON into tables and plots."""
