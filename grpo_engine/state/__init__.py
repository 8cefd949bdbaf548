"""The run's state: checkpoints, resume, stop signals, health checks, metrics and their plot."""
