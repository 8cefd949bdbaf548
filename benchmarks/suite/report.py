"""Turn pytest-benchmark JSON from this suite into markdown tables, PNG plots and the README block.

    python -m benchmarks.suite.report RESULTS.json [--out RESULTS.md] [--plots DIR | --no-plots]
    python -m benchmarks.suite.report --readme benchmarks/results/*.json   # the README's headline table
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import file_to_update, output_directory, output_file
from grpo_engine.command_failure import run_tool
from grpo_engine.state.atomic_file import FileWriteError, write_atomically

from ..model import roofline
from .cases import LOSS_CASES, OPERATIONS, REGIMES
from .paths import PATHS, ROUTED
from .results_file import ResultsFileError, read_results
MIB = 2**20
OPERATION_TITLES = {
    "loss": "Loss forward + backward (from hidden states)",
    "logprobs": "Forward-only per-token log-probs",
    "logits": "Loss forward + backward from precomputed logits",
}
PATH_ORDER = {name: i for i, name in enumerate((*PATHS, "floor"))}


@dataclass(frozen=True)
class Result:
    path: str
    operation: str
    config: str
    regime: str
    head: str
    hidden: int
    vocab: int
    tokens: int
    dtype: str
    median_ms: float
    flops: int
    peak_extra_bytes: Optional[int]
    mean_entropy: Optional[float]
    extra: dict

    @property
    def tflops(self) -> Optional[float]:
        return self.flops / (self.median_ms * 1e-3) / 1e12 if self.flops else None


@dataclass
class Run:
    source: str
    meta: dict
    results: list[Result]
    skipped: list[dict]


def load_run(path: str) -> Run:
    """One pytest-benchmark JSON written by this suite (each case's fields checked: results_file.read_results)."""
    data = read_results(path)
    results = []
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        if "path" not in info:
            continue  # not a case of this suite
        median_ms = info.get("cuda_event_median_ms") or bench["stats"]["median"] * 1e3
        results.append(Result(
            path=info["path"], operation=info["operation"], config=info["config"], regime=info["regime"],
            head=info["head"], hidden=info["hidden"], vocab=info["vocab"], tokens=info["tokens"],
            dtype=info["dtype"], median_ms=median_ms, flops=info.get("flops", 0),
            peak_extra_bytes=info.get("peak_extra_bytes"), mean_entropy=info.get("mean_entropy"), extra=info))
    meta = data.get("machine_info", {}).get("grpo_bench", {})
    meta = {**meta, "datetime": data.get("datetime"), "commit": data.get("commit_info", {}).get("id")}
    return Run(source=path, meta=meta, results=results, skipped=data.get("skipped", []))


# ---- derived numbers -----------------------------------------------------------------------------

def _key(result: Result) -> tuple:
    return result.operation, result.config, result.regime, result.head, result.tokens


def baselines(results: Iterable[Result]) -> tuple[dict, dict]:
    """(reference result per case key, floor result per (operation, head, tokens))."""
    reference, floor = {}, {}
    for r in results:
        if r.path == "reference":
            reference[_key(r)] = r
        elif r.path == "floor":
            floor[(r.operation, r.head, r.tokens)] = r
    return reference, floor


def speedup_vs_reference(result: Result, reference: dict) -> Optional[float]:
    """How many times faster than the eager reference on the same case (>1 is faster)."""
    ref = reference.get(_key(result))
    return ref.median_ms / result.median_ms if ref else None


def times_floor(result: Result, floor: dict) -> Optional[float]:
    """Time over the bare-GEMM floor of the same shape (>= 1 unless the path skips work)."""
    base = floor.get((result.operation, result.head, result.tokens))
    return result.median_ms / base.median_ms if base and result.path != "floor" else None


def predicted_ms(run: Run, result: Result) -> Optional[float]:
    """The roofline model's time for this case on the run's GPU (None on CPU and for unmodelled cases)."""
    if run.meta.get("device_type") != "cuda":
        return None
    # a run measured before the GEMM path could take a sequence-level loss in waves records no sequence rows
    return roofline.predict_case_ms(run.meta.get("device", ""), result.path, result.operation, result.config,
                                    result.hidden, result.vocab, result.tokens, result.dtype,
                                    result.extra.get("valid_tokens"), result.extra.get("sequence_rows", 0))


def _prediction_cells(run: Run, result: Result) -> str:
    """' | predicted ms | measured / predicted' for GPU runs, nothing otherwise."""
    if run.meta.get("device_type") != "cuda":
        return ""
    predicted = predicted_ms(run, result)
    ratio = None if predicted is None else result.median_ms / predicted
    return f" | {_fmt(predicted, ',.2f')} | {_ratio(ratio)}"


def _prediction_header(run: Run) -> tuple[str, str]:
    if run.meta.get("device_type") != "cuda":
        return "", ""
    return " | predicted ms | measured / predicted", "---:|---:|"


SCENARIOS = (("loss", "dapo_kl", "token-level loss"), ("loss", "gspo_kl", "sequence-level loss"),
             ("loss", "dapo_kl_frozen", "frozen head"), ("logprobs", "dapo_kl", "no-grad log-probs"),
             ("loss", "gspo_on_policy", "on-policy sequence-level loss"))


def model_error_table(run: Run) -> list[str]:
    """Measured / predicted per operation and path on a GPU run (the range over its shapes): where the roofline
    model is off, and by how much. Empty on CPU runs."""
    if run.meta.get("device_type") != "cuda":
        return []
    ratios: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for r in run.results:
        predicted = predicted_ms(run, r)
        # log-probs take no loss configuration; the floor's rows belong to every scenario of their operation
        config = "" if r.path == "floor" else "dapo_kl" if r.operation == "logprobs" else r.config
        if predicted and r.regime in ("flat", "any") and (r.operation, config) in {s[:2] for s in SCENARIOS} | {
                ("loss", ""), ("logprobs", "")}:
            ratios[(r.operation, config)].append((r.path, r.median_ms / predicted))
    paths = [p for p in (*ROUTED, *PATHS, "floor") if any(p == path for rows in ratios.values() for path, _ in rows)]
    if not paths:
        return []
    lines = ["", f"### Measured / predicted by the roofline model, per operation ({run.meta.get('device', '?')})", "",
             "Measured on the GPU above; predicted by the model for the same cases. Each cell: the range over the "
             "shapes measured (one value where one shape was). 1.00x is a perfect prediction.", "",
             "| operation | " + " | ".join(paths) + " |", "|---|" + "---:|" * len(paths)]
    for operation, config, label in SCENARIOS:
        rows = ratios.get((operation, config), []) + [(p, x) for p, x in ratios.get((operation, ""), [])
                                                      if config == "dapo_kl"]
        cells = []
        for path in paths:
            values = [x for p, x in rows if p == path]
            low, high = (f"{min(values):.2f}", f"{max(values):.2f}") if values else ("", "")
            cells.append("-" if not values else f"{low}x" if low == high else f"{low}-{high}x")
        if any(cell != "-" for cell in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def memory_vs_reference(result: Result, reference: dict) -> Optional[float]:
    ref = reference.get(_key(result))
    if not ref or not ref.peak_extra_bytes or result.peak_extra_bytes is None:
        return None
    return result.peak_extra_bytes / ref.peak_extra_bytes


# ---- markdown --------------------------------------------------------------------------------------

def _fmt(value: Optional[float], spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _ratio(value: Optional[float]) -> str:
    # Ratios span 0.001x (an interpreter) to 1000x: two decimals, or two significant digits below 0.1.
    if value is None:
        return "-"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _mib(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / MIB:,.1f}"


def header(run: Run) -> list[str]:
    m = run.meta
    versions = ", ".join(f"{name} {m[key]}" for key, name in
                         (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"), ("liger_kernel", "liger-kernel"),
                          ("cut_cross_entropy", "cut-cross-entropy"), ("trl", "trl")) if m.get(key))
    checks = m.get("gpu_checks") or ([m["gpu_tests"]] if m.get("gpu_tests") else [])  # the smoke, then the tests
    tests_line = [line for check in checks for line in (
        "", f"GPU check: `{check['command']}`: {check['summary']} (exit code {check['exit_code']}, "
            f"{check['seconds']} s).")]
    return [
        f"Device: **{m.get('device', '?')}** ({m.get('device_type', '?')}, torch threads: {m.get('torch_threads', '?')}, "
        f"load average at the end of the run: {m.get('load_average_1_5_15m', '?')}); {versions}; Python {m.get('python', '?')}.",
        "",
        f"Command: `{m.get('command_line', '?')}`; run {m.get('datetime', '?')} at commit `{(m.get('commit') or '?')[:12]}`.",
        *tests_line,
    ]


LEGEND = (
    "Time is the median over the timed rounds (CUDA events on GPU, wall clock on CPU). Peak extra is the memory "
    "a step allocates beyond its inputs at its highest point: `torch.cuda.max_memory_allocated()` minus the "
    "allocation before the step on GPU; on CPU the peak RSS of a fresh process minus its RSS before the step. "
    "Speedup is reference time / path time. x floor is path time / time of the bare GEMMs of the same shapes "
    "(3 for the loss step, 1 for the log-probs). TFLOP/s counts 2*N*H*V per GEMM-equivalent over all B*T "
    "positions, padding included."
)
GPU_LEGEND = (
    " Predicted ms is the roofline model's time for the case on this GPU (benchmarks/model/roofline.py; "
    "`python -m benchmarks.model.roofline` prints its counts); measured / predicted above 1 is time the model "
    "does not explain."
)


def case_tables(run: Run) -> list[str]:
    reference, floor = baselines(run.results)
    predicted_head, predicted_rule = _prediction_header(run)
    lines: list[str] = []
    grouped = defaultdict(list)
    for r in run.results:
        if r.operation in OPERATIONS and r.path != "floor":
            grouped[(r.operation, r.config, r.regime)].append(r)
    for operation in OPERATIONS:
        sections = sorted((k for k in grouped if k[0] == operation),
                          key=lambda k: (list(LOSS_CASES).index(k[1]) if k[1] in LOSS_CASES else 99, REGIMES.index(k[2])))
        if not sections:
            continue
        lines += ["", f"### {OPERATION_TITLES[operation]}"]
        for _, config, regime in sections:
            rows = sorted(grouped[(operation, config, regime)],
                          key=lambda r: (r.head, r.tokens, PATH_ORDER.get(r.path, 99)))
            entropies = {(r.head, r.tokens): r.mean_entropy for r in rows if r.mean_entropy is not None}
            entropy = ", ".join(f"{head} N={tokens}: {value:.2f}" for (head, tokens), value in sorted(entropies.items()))
            title = f"config `{config}`, " if operation != "logprobs" else ""
            lines += ["", f"**{title}{regime} logits** (mean token entropy, nats: {entropy})", "",
                      "| head (H, V) | N | path | median ms | speedup vs reference | x floor | TFLOP/s "
                      f"| peak extra MiB | memory vs reference{predicted_head} |",
                      "|---|---:|---|---:|---:|---:|---:|---:|---:|" + predicted_rule]
            for r in rows:
                lines.append(
                    f"| {r.head} ({r.hidden}, {r.vocab}) | {r.tokens} | {r.path} | {r.median_ms:,.2f} "
                    f"| {_ratio(speedup_vs_reference(r, reference))} | {_ratio(times_floor(r, floor))} "
                    f"| {_fmt(r.tflops, '.3g')} | {_mib(r.peak_extra_bytes)} "
                    f"| {_ratio(memory_vs_reference(r, reference))}{_prediction_cells(run, r)} |")
    floors = sorted((r for r in run.results if r.path == "floor"), key=lambda r: (r.operation, r.head, r.tokens))
    if floors:
        lines += ["", "### Bare-GEMM floor", "",
                  f"| operation | head (H, V) | N | GEMMs | median ms | TFLOP/s | peak extra MiB{predicted_head} |",
                  "|---|---|---:|---:|---:|---:|---:|" + predicted_rule]
        for r in floors:
            gemms = 3 if r.operation == "loss" else 1
            lines.append(f"| {r.operation} | {r.head} ({r.hidden}, {r.vocab}) | {r.tokens} | {gemms} | {r.median_ms:,.2f} "
                         f"| {_fmt(r.tflops, '.3g')} | {_mib(r.peak_extra_bytes)}{_prediction_cells(run, r)} |")
    return lines


def memory_wall_table(run: Run) -> list[str]:
    walls = [r for r in run.results if "max_tokens" in r.extra]
    if not walls:
        return []
    lines = ["", f"### Memory wall: largest N whose dapo loss step fits ({walls[0].head}, {walls[0].dtype})", "",
             "| path | largest N that fits | hit the wall | peak extra GiB at that N | median ms at that N |",
             "|---|---:|---|---:|---:|"]
    for r in sorted(walls, key=lambda r: PATH_ORDER.get(r.path, 99)):
        peak = "-" if r.peak_extra_bytes is None else f"{r.peak_extra_bytes / 2**30:,.2f}"
        hit = "yes" if r.extra.get("hit_wall") else "no (largest size tried)"
        lines.append(f"| {r.path} | {r.extra['max_tokens']:,} | {hit} | {peak} | {r.median_ms:,.1f} |")
    return lines


def skipped_table(run: Run) -> list[str]:
    if not run.skipped:
        return []
    by_reason = defaultdict(int)
    for s in run.skipped:
        by_reason[s["reason"]] += 1
    lines = ["", "### Skipped cases", "", "| cases | reason |", "|---:|---|"]
    lines += [f"| {count} | {reason} |" for reason, count in sorted(by_reason.items(), key=lambda kv: -kv[1])]
    return lines


def full_report(run: Run) -> str:
    lines = [f"## GRPO loss benchmarks: {run.meta.get('device', '?')}", "",
             f"Generated by `python -m benchmarks.suite.report {run.source}` from pytest-benchmark JSON; do not edit by hand.",
             "", *header(run), "", LEGEND + (GPU_LEGEND if run.meta.get("device_type") == "cuda" else "")]
    lines += case_tables(run) + model_error_table(run) + memory_wall_table(run) + skipped_table(run)
    return "\n".join(lines) + "\n"


def readme_block(runs: list[Run]) -> str:
    """The README's headline: loss step (dapo) at the largest N per head, both regimes, every device."""
    sources = " ".join(run.source for run in runs)
    lines = [f"<!-- benchmarks:begin - generated by `python -m benchmarks.suite.report --readme {sources}`; do not edit -->"]
    for run in runs:
        reference, floor = baselines(run.results)
        # the suite's dapo, or the GPU command's dapo with beta = 0.04 (the target shapes' setting)
        config = "dapo" if any(r.config == "dapo" for r in run.results) else "dapo_kl"
        predicted_head, predicted_rule = _prediction_header(run)
        measured = " (measured)" if run.meta.get("device_type") == "cuda" else ""
        loss = [r for r in run.results if r.operation == "loss" and r.config == config and r.path != "floor"]
        largest = {}
        for r in loss:
            largest[r.head] = max(largest.get(r.head, 0), r.tokens)
        rows = sorted((r for r in loss if r.tokens == largest[r.head]),
                      key=lambda r: (r.head, REGIMES.index(r.regime), PATH_ORDER.get(r.path, 99)))
        lines += ["", f"**{run.meta.get('device', '?')}** (torch {run.meta.get('torch', '?')}, "
                      f"`{run.meta.get('command_line', '?')}`): GRPO loss forward + backward, {config}, {rows[0].dtype if rows else ''}"
                  f"{measured}", "",
                  "| head (H, V) | N | logits | path | median ms | speedup vs reference | x floor | peak extra MiB"
                  f"{predicted_head} |", "|---|---:|---|---|---:|---:|---:|---:|" + predicted_rule]
        for i, r in enumerate(rows):
            lines.append(f"| {r.head} ({r.hidden}, {r.vocab}) | {r.tokens} | {r.regime} | {r.path} | {r.median_ms:,.2f} "
                         f"| {_ratio(speedup_vs_reference(r, reference))} | {_ratio(times_floor(r, floor))} "
                         f"| {_mib(r.peak_extra_bytes)}{_prediction_cells(run, r)} |")
            gemms = floor.get(("loss", r.head, r.tokens))
            if gemms and (i + 1 == len(rows) or rows[i + 1].head != r.head):  # the head's floor after its rows
                lines.append(f"| {r.head} ({r.hidden}, {r.vocab}) | {r.tokens} | any | floor (3 GEMMs) "
                             f"| {gemms.median_ms:,.2f} | - | 1.00x | {_mib(gemms.peak_extra_bytes)}"
                             f"{_prediction_cells(run, gemms)} |")
        lines += model_error_table(run) + memory_wall_table(run)
    lines.append("<!-- benchmarks:end -->")
    return "\n".join(lines) + "\n"


# ---- plots -----------------------------------------------------------------------------------------

def draw_plots(run: Run, out_dir: str, config: str = "dapo") -> list[str]:
    """Time and peak extra memory vs N per path (log-log), one PNG per (operation, regime, head)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []
    panels = defaultdict(list)
    for r in run.results:
        if r.operation in OPERATIONS and r.path != "floor" and r.config == config:
            panels[(r.operation, r.regime, r.head)].append(r)
    floors = [r for r in run.results if r.path == "floor"]
    for (operation, regime, head), results in sorted(panels.items()):
        fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
        by_path = defaultdict(list)
        for r in results:
            by_path[r.path].append(r)
        floor_points = sorted((r for r in floors if r.operation == operation and r.head == head), key=lambda r: r.tokens)
        if floor_points:
            by_path["floor"] = floor_points
        for path in sorted(by_path, key=lambda p: PATH_ORDER.get(p, 99)):
            points = sorted(by_path[path], key=lambda r: r.tokens)
            style = {"linestyle": "--", "color": "black"} if path == "floor" else {}
            ax_time.plot([p.tokens for p in points], [p.median_ms for p in points], marker="o", label=path, **style)
            mem = [(p.tokens, p.peak_extra_bytes / MIB) for p in points if p.peak_extra_bytes]
            if mem:
                ax_mem.plot(*zip(*mem), marker="o", label=path, **style)
        for ax, label in ((ax_time, "median time (ms)"), (ax_mem, "peak extra memory (MiB)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("tokens N")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        sample = results[0]
        subtitle = f", config {config}" if operation != "logprobs" else ""
        fig.suptitle(f"{OPERATION_TITLES[operation]}: {head} (H={sample.hidden}, V={sample.vocab}, {sample.dtype}), "
                     f"{regime} logits{subtitle}\n{run.meta.get('device', '')}", fontsize=10)
        fig.tight_layout()
        name = os.path.join(out_dir, f"{operation}-{regime}-{head}.png")
        fig.savefig(name, dpi=90)
        plt.close(fig)
        written.append(name)
    return written


def update_readme(path: str, block: str) -> None:
    """Replace the generated block between the benchmarks:begin / benchmarks:end markers of a README."""
    with open(path) as f:
        text = f.read()
    begin, end = text.find("<!-- benchmarks:begin"), text.find("<!-- benchmarks:end -->")
    if begin < 0 or end < begin:
        raise ValueError(f"{path} has no <!-- benchmarks:begin --> ... <!-- benchmarks:end --> markers")
    end += len("<!-- benchmarks:end -->\n")
    write_atomically(path, text[:begin] + block + text[end:])  # stopped midway, the README stays whole


def main(argv: Optional[list[str]] = None) -> int:
    try:
        return _report(argv)
    except FileWriteError as exc:  # a full disk or a read-only file: one line, the earlier file left whole
        print(f"python -m benchmarks.suite.report: {exc}", file=sys.stderr)
        return 1


def _report(argv: Optional[list[str]]) -> int:
    parser = CommandParser(prog="python -m benchmarks.suite.report", description=doc_summary(__doc__, first_line=True))
    parser.add_argument("results", nargs="+", help="pytest-benchmark JSON files written by `pytest benchmarks/suite/`")
    parser.add_argument("--readme", action="store_true", help="print only the README headline block (all files)")
    parser.add_argument("--out", type=output_file,
                        help="also write the markdown report to this file (one results file only)")
    parser.add_argument("--plots", type=output_directory,
                        help="directory for the PNG plots (default: next to the JSON, <name>-plots/)")
    parser.add_argument("--no-plots", action="store_true", help="do not draw plots")
    parser.add_argument("--update-readme", metavar="README", type=file_to_update,
                        help="write the headline block into this file's markers")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.results]
    except ResultsFileError as exc:
        parser.error(str(exc))
    if args.out and any(os.path.realpath(args.out) == os.path.realpath(path) for path in args.results):
        parser.error(f"argument --out: {args.out!r} is a results file given to read; writing the report there "
                     f"would replace it")
    # Two options naming one path: the report was written, then the plots failed on it (or replaced it)
    written = [(f"--{name.replace('_', '-')}", value) for name in ("out", "plots", "update_readme")
               if (value := getattr(args, name))]
    for index, (option, path) in enumerate(written):
        for other, other_path in written[:index]:
            if os.path.realpath(path) == os.path.realpath(other_path):
                parser.error(f"argument {option}: {path!r} is the path {other} writes; give each its own")
    if args.readme or args.update_readme:
        if args.update_readme:
            update_readme(args.update_readme, readme_block(runs))
        else:
            sys.stdout.write(readme_block(runs))
        return 0
    if args.out and len(runs) != 1:
        parser.error("--out takes one results file")
    for run in runs:
        text = full_report(run)
        sys.stdout.write(text)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)  # as the type allowed
            write_atomically(args.out, text)
        if not args.no_plots:
            out_dir = args.plots or os.path.splitext(run.source)[0] + "-plots"
            for name in draw_plots(run, out_dir):
                print(f"wrote {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.suite.report"))
