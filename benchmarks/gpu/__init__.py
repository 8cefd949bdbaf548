"""The one GPU command (`python -m benchmarks.gpu`): the command itself, the plan of its parts, its results
folder."""
