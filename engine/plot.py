"""A PNG of a run's reward, KL and entropy curves from its metrics.jsonl (`grpo-engine plot RUN_DIR`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .metrics import read_metrics

PANELS = (("reward", "reward"), ("kl", "KL to reference"), ("entropy", "entropy"))


def plot_run(run_dir: str | Path, output: Optional[str | Path] = None) -> Path:
    """Writes RUN_DIR/curves.png (or `output`); panels without data (kl when beta = 0) are skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; no display on training machines
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install matplotlib") from exc
    rows = read_metrics(run_dir)
    panels = [(key, title) for key, title in PANELS if any(row.get(key) is not None for row in rows)]
    if not panels:
        raise ValueError(f"{run_dir}: metrics.jsonl has no reward, kl or entropy values to plot")
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.4 * len(panels)), sharex=True, squeeze=False)
    for ax, (key, title) in zip(axes[:, 0], panels):
        points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]  # null: not measured
        ax.plot([p[0] for p in points], [p[1] for p in points], linewidth=1.2)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    path = Path(output) if output is not None else Path(run_dir) / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
