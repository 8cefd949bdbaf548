"""A PNG of a run's curves from its metrics.jsonl (`grpo-engine plot RUN_DIR`): reward and entropy, and the
KL to the reference when the run logged one (loss.beta != 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .atomic_file import replacing

PANELS = (("reward", "reward"), ("kl", "KL to reference"), ("entropy", "entropy"))
# What the PNG shows, as the README, docs/engine.md and `grpo-engine plot --help` say it (a test holds them to it).
CURVES = "reward and entropy curves (and KL when loss.beta != 0)"


PLOT_FILE = "curves.png"  # what `plot RUN_DIR` and a finished run write in the run directory


def panels(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(metric, title) of each panel with data: a run with beta = 0 logs no kl, so it has no KL panel."""
    return [(key, title) for key, title in PANELS if any(row.get(key) is not None for row in rows)]


def image_formats() -> dict[str, str]:
    """{suffix: name} of the image formats matplotlib writes."""
    from matplotlib.backend_bases import FigureCanvasBase

    return FigureCanvasBase.get_supported_filetypes()


def plot_run_dir(named: str) -> str:
    """The run directory `plot RUN_DIR` draws: RUN_DIR itself, or the directory of the metrics.jsonl named in its
    place (before, ".../metrics.jsonl/metrics.jsonl does not exist"); another file is refused naming its directory."""
    path = Path(named).expanduser()
    if path.is_dir() or not path.exists():
        return named
    if path.resolve().name == "metrics.jsonl" and path.is_file():  # a link to one: its run is where it points
        return str(path.resolve().parent)
    # the directory beside it is offered only when it is a run's (a link named otherwise was offered its own folder)
    beside = f" ({str(path.parent)!r}?)" if (path.parent / "metrics.jsonl").is_file() else ""
    raise ValueError(f"plot RUN_DIR {named!r} is a file, not a run directory: name the directory that holds "
                     f"metrics.jsonl{beside}")


def check_plot_output(output: str | Path) -> None:
    """The file `plot --output` names is an image of a format matplotlib writes, by its suffix (none: PNG).
    matplotlib refused another only once the metrics had been read and drawn, in a message naming no option; a
    run's own metrics.jsonl named there would be written over where a format of that suffix existed."""
    suffix = Path(output).suffix.lower().removeprefix(".")
    formats = image_formats()
    if suffix and suffix not in formats:
        raise ValueError(f"--output {str(output)!r}: .{suffix[:20]} is not an image format the plot is written in "
                         f"(one of {', '.join(sorted(formats))}; PNG without a suffix)")


def plot_run(run_dir: str | Path, output: Optional[str | Path] = None) -> Path:
    """Writes RUN_DIR/curves.png (or `output`), one panel per curve with data."""
    from .metrics import read_metrics  # here: the CLI reads CURVES for its help without importing torch

    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; no display on training machines
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install matplotlib") from exc
    rows = read_metrics(run_dir)
    shown = panels(rows)
    if not shown:
        raise ValueError(f"{run_dir}: metrics.jsonl has no reward, kl or entropy values to plot")
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 2.4 * len(shown)), sharex=True, squeeze=False)
    for ax, (key, title) in zip(axes[:, 0], shown):
        points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]  # null: not measured
        ax.plot([p[0] for p in points], [p[1] for p in points], linewidth=1.2)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    path = Path(output) if output is not None else Path(run_dir) / PLOT_FILE
    path = path if path.suffix else path.with_suffix(".png")  # where matplotlib writes a name without a suffix
    try:
        with replacing(path) as partial:  # a failed or interrupted plot leaves an earlier image whole
            fig.savefig(partial, dpi=110)
    finally:
        plt.close(fig)  # also when the write fails: pyplot keeps every open figure
    return path
