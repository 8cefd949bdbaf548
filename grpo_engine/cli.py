"""`grpo-engine train | eval | plot | bench | serve`.

Every config key is also a flag (`--optim.learning_rate 1e-5`, `--loss.beta 0.04`), its value read as the
type of the key it sets: a string key takes the text as written, `null` unsets a key that may be null, and
numbers, true/false and [lists] read as in the YAML file. Flags override the YAML file, which overrides
the defaults (and, when no model is given, the built-in demo preset).

Help, argument errors and config errors never wait for torch or transformers (seconds to import): those
are imported only once a command is known to run.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from .address_space import check_address_space, out_of_memory_message
from .cli_parser import CommandLineError, CommandParser, doc_summary
from .cli_types import path_text, positive_int
from .command_failure import NAMED_FAILURES, failure_status
from .data.demo_task import DEMO_PRESET
from .messages import show_messages
from .standard_streams import guard_output, lost_output, open_closed_streams
from .state.interrupt import TrainingInterrupted, outlive_the_terminal
from .state.plot import CURVES as PLOT_CURVES, PLOT_FILE
from .state.path_limits import check_path_length, shown as shown_path
from .state.run_and_data import check_apart_from_data, inputs_of
from .state.resume_target import check_resume_target
from .state.run_lock import check_output_dir, check_output_file, check_run_entries, check_writable_dir
from .tools.bench_options import DESCRIPTION as BENCH_DESCRIPTION
from .tools.bench_options import build_parser as build_bench_parser


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    from .config import key_help

    parser.add_argument("--config", help="YAML config file (sections: model, data, rollout, rewards, loss, optim, "
                                         "run); relative data paths in it are read next to it")
    group = parser.add_argument_group(
        "config keys (any key of the YAML tree; a string key takes VALUE as written, null unsets, numbers, "
        "true/false and [lists] read as in YAML)",
        "Defaults are the engine's; `train` without a model starts from the demo preset (examples/demo.yaml).")
    for key, meaning in key_help().items():
        group.add_argument(f"--{key}", dest=f"cfg:{key}", metavar="VALUE", default=argparse.SUPPRESS, help=meaning)


# The options besides the config keys that always take one value: `--data -x.jsonl` is the file -x.jsonl.
VALUE_OPTIONS = ("--config", "--model", "--data", "--output-dir", "--max-steps", "--num-samples", "--output")
# options whose value may be left out (`--resume` alone: the latest checkpoint): an argument after one that starts
# with a single '-' (no option of the commands does, -h aside) is its value, checked as its value and named so
# (`--resume -1e+16` was "unknown flag -1e+16")
OPTIONAL_VALUE_OPTIONS = ("--resume",)


def option_names(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The option strings of `parser` and of the subcommand `argv` names (of every subcommand if it names none)."""
    names = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            named = [action.choices[arg] for arg in argv if arg in action.choices][:1] or action.choices.values()
            for command_parser in named:
                names |= option_names(command_parser, ())
    return names


@functools.lru_cache(maxsize=1)
def _default_parser() -> argparse.ArgumentParser:
    return build_parser()


def join_flag_values(argv: Sequence[str], parser: Optional[argparse.ArgumentParser] = None) -> list[str]:
    """`--data.system_prompt "-be brief"` -> `--data.system_prompt=-be brief`: a config flag (and each of
    VALUE_OPTIONS) always takes the next argument as its value, which argparse would take for an option when it
    starts with '-' (a negative number, a string). Not when that argument is itself one of the command's options
    (`--run.max_steps --run.seed 3`): its value was left out, which argparse then says naming the flag (before,
    `serve --model --port 80` served a model named '--port', and train said only "unexpected value '3'"). Such a
    value is given joined: `--data.system_prompt=--run.seed`."""
    from .config import leaf_keys

    flags = {f"--{key}" for key in leaf_keys()} | set(VALUE_OPTIONS)
    options = option_names(parser if parser is not None else _default_parser(), argv)
    joined: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":  # what follows is another program's (serve's vLLM arguments): passed on as written
            return joined + list(argv[i:])
        if joined and arg.split("=", 1)[0] not in options and (joined[-1] in flags and arg.startswith("-")
                       or joined[-1] in OPTIONAL_VALUE_OPTIONS and arg.startswith("-") and not arg.startswith("--")
                       and arg != "-h"):
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


# What `grpo-engine` cannot start without, beyond the loss library: module -> the package (the engine extra) that
# installs it. matplotlib (the plot), peft (LoRA) and pyarrow (Parquet) are checked where they are used.
ENGINE_MODULES = {"pydantic": "pydantic", "yaml": "pyyaml", "transformers": "transformers",
                  "accelerate": "accelerate", "tqdm": "tqdm", "safetensors": "safetensors"}
INSTALL_ENGINE = 'pip install "grpo-kernels[engine]" (in a checkout: pip install -e ".[engine]")'


def missing_engine_packages() -> list[str]:
    """The engine extra's packages that are not installed (found without importing them)."""
    return [package for module, package in ENGINE_MODULES.items() if importlib.util.find_spec(module) is None]


def _site_left_out() -> Optional[str]:
    """What this interpreter's flags leave off the import path where installed packages live: `python -S` all of
    site-packages, -s / -I / PYTHONNOUSERSITE the user's (pip install --user). "Install it" alone sent a user with
    everything installed to reinstall."""
    if sys.flags.no_site:
        return "This Python was started with -S, which leaves out site-packages, where they may be: run it without -S. "
    import site

    user_site = site.getusersitepackages()
    if sys.flags.no_user_site and any((Path(user_site) / module).exists() for module in ENGINE_MODULES):
        return (f"This Python was started with -s or -I (or PYTHONNOUSERSITE), which leaves out {user_site}, where "
                f"packages are installed: run it without. ")
    return None


def _overrides(args: argparse.Namespace, shortcuts: dict[str, str]) -> dict[str, Any]:
    from .config import ConfigError, flag_value

    values: dict[str, Any] = {}
    for name, value in vars(args).items():
        if name.startswith("cfg:"):
            values[name[4:]] = flag_value(name[4:], value)
    for attr, key in shortcuts.items():
        value = getattr(args, attr, None)
        if value is None:
            continue
        value = flag_value(key, value)
        if key in values and values[key] != value:
            option = "--" + attr.replace("_", "-")
            raise ConfigError(f"{key}: {option} {value!r} and --{key} {values[key]!r} set the same key; give one")
        values[key] = value
    return values


def build_parser() -> argparse.ArgumentParser:
    # CommandParser (cli_parser.py): one line per argument error, no abbreviations, no flag given twice; the
    # subcommands' parsers are of its class.
    parser = CommandParser(prog="grpo-engine", description=doc_summary(__doc__))
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train with GRPO (no arguments: the built-in demo on CPU)",
                           allow_abbrev=False)
    from .config import leaf_fields

    new_tokens = leaf_fields()["rollout.max_new_tokens"].default
    train.add_argument("--model", help="local Hugging Face causal-LM directory or Hub id ORG/NAME "
                                        "(= --model.name_or_path). Naming a model drops the demo's preset "
                                        "(examples/demo.yaml): every other setting is then the default shown "
                                        f"below (e.g. rollout.max_new_tokens {new_tokens}, not the demo's "
                                        f"{DEMO_PRESET['rollout']['max_new_tokens']}) unless a flag or --config "
                                        "sets it")
    train.add_argument("--data", help="JSONL / Parquet / datasets directory or Hub dataset id ORG/NAME with a prompt "
                                       "column (= --data.path)")
    train.add_argument("--output-dir", help="run directory (= --run.output_dir)")
    train.add_argument("--max-steps", help="= --run.max_steps")
    train.add_argument("--resume", nargs="?", const="latest",
                       help="continue from the latest checkpoint of the run directory, or from the given one")
    _add_config_flags(train)

    evaluate = sub.add_parser("eval", help="accuracy and pass@k with the reward functions", allow_abbrev=False)
    evaluate.add_argument("--model", required=True, help="model directory or Hub id (a checkpoint's model/ works, "
                                                         "LoRA too); "
                                                         "overrides model.name_or_path of --config")
    evaluate.add_argument("--data", help="prompt file or Hub dataset id (its data.eval_split); default: the built-in "
                                          "task's held-out split")
    evaluate.add_argument("--num-samples", help="samples per prompt for pass@k (= --run.eval_num_samples; default 1)")
    evaluate.add_argument("--sample", action="store_true", help="sample at rollout.temperature even with one sample")
    evaluate.add_argument("--batch-size", type=positive_int, default=64, help="completions generated at once")
    evaluate.add_argument("--output", type=path_text, help="also write the metrics to this JSON file")
    _add_config_flags(evaluate)

    plot = sub.add_parser("plot", help=f"PNG of a run directory's {PLOT_CURVES}", allow_abbrev=False)
    plot.add_argument("run_dir", type=path_text)
    plot.add_argument("--output", type=path_text, help="PNG path (default RUN_DIR/curves.png)")

    from .tools.serve import add_serve_arguments

    add_serve_arguments(sub.add_parser(
        "serve", help="a vLLM server for rollout.backend vllm_server (processed log-probs, weight updates on)",
        allow_abbrev=False))
    build_bench_parser(sub.add_parser("bench", help="one GRPO step of a real architecture: reference loss vs fused",
                                      description=BENCH_DESCRIPTION, allow_abbrev=False))
    return parser


def train_config(args: argparse.Namespace) -> Any:
    """The EngineConfig `grpo-engine train` runs with these parsed arguments, its paths checked: ConfigError (and the
    run directory's errors) in one line otherwise. Also what a tool that starts `train` checks its flags with
    (grpo_engine/tools/train_flags.py)."""
    from .config import load_config

    overrides = _overrides(args, {"model": "model.name_or_path", "data": "data.path", "output_dir": "run.output_dir",
                                  "max_steps": "run.max_steps", "resume": "run.resume"})
    _check_input_paths(("--config", args.config))
    model_given = overrides.get("model.name_or_path") is not None or _yaml_sets(args.config, "model", "name_or_path")
    uses_builtin_model = not model_given
    return load_config(args.config, overrides, preset=DEMO_PRESET if uses_builtin_model else None)


def _train(args: argparse.Namespace) -> int:
    config = train_config(args)
    check_output_dir(config.run.output_dir)  # before seconds of imports, not after
    check_run_entries(config.run.output_dir)
    check_resume_target(config.run.resume, config.run.output_dir)
    check_apart_from_data(config.run.output_dir, inputs_of(config.data.path, config.data.eval_path,
                                                           config.model.name_or_path))
    from .state.finished_run import RunFinished
    from .state.run_summary import summary_lines
    from .trainer import train  # torch and transformers: only for a valid config

    try:
        summary = train(config)
    except RunFinished as finished:  # the same command again: its results, and how to train on
        print(finished)
        return 0
    for line in summary_lines(summary.rewards, summary.eval_before, summary.eval_after, config):
        print(line)
    held = [name for name in ("metrics.jsonl", "samples.jsonl", PLOT_FILE, "checkpoints/")  # as written (run.plot)
            if (Path(summary.run_dir) / name).exists()]
    print(f"run directory: {summary.run_dir} ({', '.join(held)})")
    return 0


def _check_input_paths(*named: tuple[str, Optional[str]]) -> None:
    """A path read by the command that no filesystem could hold (a name or the whole too long) or that is a link
    leading nowhere (gone, or a loop) is one line naming its option, before any work
    (grpo_engine/state/path_limits.py); the config's own paths are checked by its schema."""
    from .config import ConfigError
    from .config.path_form import path_form_problem
    from .config.schema import broken_link

    for key, path in named:
        if path and path.strip():  # blank: refused by the config reader as blank text
            problem = path_form_problem(path)  # before any look: `~nosuchuser/c.yaml` raised pathlib's RuntimeError
            if problem:
                raise ConfigError(f"{key} {shown_path(path)}: expected {problem}")  # elided: a path past PATH_MAX
            check_path_length(path, key)
            link = broken_link(Path(path).expanduser())  # else "does not exist", naming no link (a loop of links)
            if link is not None:
                raise ConfigError(f"{key} {path!r}: {link}; fix the link or name the file itself")


def _yaml_sets(path: Optional[str], section: str, key: str) -> bool:
    """Whether the config file sets `section.key`. A section that is not a mapping sets nothing here: the schema
    refuses it, naming it, when the config loads."""
    from .config import read_yaml

    if path is None:
        return False
    values = read_yaml(path).get(section)
    return isinstance(values, dict) and values.get(key) is not None


def _eval(args: argparse.Namespace) -> int:
    from .config import ConfigError, load_config

    overrides = _overrides(args, {"data": "data.path", "model": "model.name_or_path",
                                  "num_samples": "run.eval_num_samples"})
    flagged = list(overrides)  # the keys the command line set (before eval's own unsetting of data.eval_path)
    # Without --data the built-in task is scored, with the demo's generation length and reward settings.
    _check_input_paths(("--config", args.config))
    if overrides.get("data.path") is not None:
        # --data names the data to score: a --config's data.eval_path (which eval otherwise scores) is not read
        if overrides.get("data.eval_path") is not None:
            raise ConfigError(f"--data {overrides['data.path']!r} and --data.eval_path "
                              f"{overrides['data.eval_path']!r} both name the data to evaluate; give one")
        overrides["data.eval_path"] = None
    builtin_task = overrides.get("data.path") is None and overrides.get("data.eval_path") is None and not any(
        _yaml_sets(args.config, "data", key) for key in ("path", "eval_path"))
    preset = {key: DEMO_PRESET[key] for key in ("data", "rollout", "rewards")} if builtin_task else None
    config = load_config(args.config, overrides, preset=preset)
    if args.output:  # before the evaluation, not after it
        from .tools.eval_output import check_eval_output_replaceable

        check_output_file(args.output)
        check_eval_output_replaceable(args.output)
        check_apart_from_data(args.output, inputs_of(config.data.path, config.data.eval_path,
                                                     model=config.model.name_or_path), key="--output",
                              run_directory=False)
    from .tools.evaluate import run_eval  # torch and transformers: only for a valid config

    samples = config.run.eval_num_samples
    greedy = samples == 1 and not args.sample
    from .tools.eval_settings import unread_eval_flags
    from .tools.evaluate import evaluation_data

    for note in unread_eval_flags(flagged, config, greedy, evaluation_data(config.data)):
        logging.getLogger(__name__).warning(f"warning: {note}")
    metrics = run_eval(config, config.model.name_or_path, samples, greedy=greedy, batch_size=args.batch_size)
    from .state.metrics import json_safe

    text = json.dumps(json_safe(metrics), indent=2)  # NaN (a reward that scored nothing) is null, as in metrics.jsonl
    print(text)
    if args.output:
        from .state.atomic_file import write_atomically

        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(args.output, text + "\n")  # a full disk or Ctrl-C leaves an earlier output whole
    return 0


def _plot(args: argparse.Namespace) -> int:
    from .state.plot import check_plot_output, plot_run, plot_run_dir

    _check_input_paths(("plot RUN_DIR", args.run_dir))
    args.run_dir = plot_run_dir(args.run_dir)
    if not args.output and Path(args.run_dir).is_dir():  # RUN_DIR/curves.png: writable, before the plot is drawn
        check_writable_dir(args.run_dir, "plot RUN_DIR")
    if args.output:
        for written in (args.output, Path(args.output).with_suffix(Path(args.output).suffix or ".png")):  # as written
            check_output_file(written, may_replace=(PLOT_FILE,))  # a run's curves.png: what the plot writes there
        check_plot_output(args.output)
    print(plot_run(args.run_dir, args.output))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .tools.bench import bench_and_print

    return bench_and_print(args)


def _serve(args: argparse.Namespace) -> int:
    from .tools.serve import serve

    return serve(args)


def unknown_arguments_message(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> str:
    """One line for arguments the command does not take, each flag with the nearest of the command's own (its
    config keys included), as a mistyped YAML key gets: `unknown flag --run.max_step (did you mean
    --run.max_steps?)`."""
    command_parser = next(action.choices[command] for action in parser._actions
                          if isinstance(action, argparse._SubParsersAction))
    options = [option for option in command_parser._option_string_actions if option.startswith("--")]
    parts = []
    for i, arg in enumerate(unknown):
        if arg == "--":  # argparse leaves every argument after it unread: each was "unknown flag" beside its own name
            parts.append(f"the arguments after '--' are not read by {command} (only serve passes them on, to vLLM); "
                         f"remove the '--'")
            break
        flag = arg.split("=", 1)[0]
        if not flag.startswith("-"):
            previous = unknown[i - 1] if i else ""
            if not (previous.startswith("-") and "=" not in previous):  # else: the unknown flag's own value
                parts.append(f"unexpected value {arg[:60]!r}")
            continue
        parts.append(_unknown_flag(flag, options))
    return "; ".join(parts) + f" (grpo-engine {command} --help lists every flag)"


def _unknown_flag(flag: str, options: list[str]) -> str:
    """`unknown flag --run.max_step (did you mean --run.max_steps?)`. A flag with a space or tab in it (one argument
    "--run.max_steps = 3" from a quoted script line) is shown quoted with how to write it: shown bare, its suggestion
    read the same as the flag. And the match ignores case (--RUN.MAX_STEPS had no suggestion)."""
    import difflib

    from .config.flags import home_of

    name = flag.split()[0] if flag.strip() else flag
    if name != flag and name in options:
        return (f"unknown flag {flag[:60]!r}: a flag's name has no space in it; write {name}=VALUE or {name} VALUE "
                f"(two arguments)")
    home = home_of(name[2:]) if name.startswith("--") and "--loss.params" in options else None
    if home is not None:  # a setting the schema holds by another key: say which, not the nearest spelling
        return f"unknown flag {name}: {home}"
    lowered = {option.lower(): option for option in options}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    shown = repr(flag[:60]) if name != flag else flag
    return f"unknown flag {shown}" + (f" (did you mean {lowered[close[0]]}?)" if close else "")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; as the program itself (no `argv`), the process ends with the command even where a reward
    function left a thread running that is not a daemon (the interpreter would wait for it forever)."""
    open_closed_streams()  # before any file is opened: none takes descriptor 1 or 2 (grpo_engine/standard_streams.py)
    show_messages()  # the engine's log as a person reads it (grpo_engine/messages.py)
    printable_output()
    outlive_the_terminal()  # a hangup during training stops at the step boundary, not at the bar's next write
    guard_output()  # a stdout that cannot be written (a full disk) drops its text; the command goes on
    try:
        code = _command(argv)
    except MemoryError:  # while the parser or the config loaded (pydantic): no command is known to name yet
        print(out_of_memory_message(None), file=sys.stderr)
        code = 1
    except SystemExit as exc:  # argparse's exit after --help: its text went to stdout too
        if exc.code not in (0, None) or lost_output() is None:
            raise
        code = 0
    lost = lost_output()  # after the flush of what the command printed last (help, a summary), which may fail too
    if lost is not None and code == 0:
        print(f"grpo-engine: {lost}", file=sys.stderr)
        code = 1
    fence = sys.modules.get("grpo_engine.steps.reward_fence")  # loaded only if a reward function ran
    left = fence.threads_left_running() if fence is not None else []
    if argv is None and left:
        print(f"grpo-engine: ending without waiting for {len(left)} thread(s) a reward function left running: "
              f"{', '.join(left[:3])}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def printable_output() -> None:
    """stdout writes what its encoding cannot hold as escapes (\\xf6), as Python's stderr always does. Under an
    ASCII or Latin-1 locale (LANG=C on an older Python, PYTHONIOENCODING=ascii, a Windows console), a run directory
    or data path with other letters made the last line of a finished run, the plot's path or a note raise
    UnicodeEncodeError: a run that had trained and saved ended with exit status 1, a plot written was reported
    failed."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a TextIOWrapper; a capture or a closed stream may not be
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # closed, or not reconfigurable once written to
                pass


def working_directory_problem() -> Optional[str]:
    """Why the current directory cannot be used, or None: deleted (or moved out of reach) under the shell that
    started the command. Relative paths then mean nothing, and torch's MKL failed to load with a fatal error."""
    try:
        os.getcwd()
    except OSError as exc:
        return (f"the current directory is gone ({exc.strerror or exc}: deleted or moved since the shell entered "
                f"it); cd to an existing directory and run the command again")
    return None


# The commands that load a model with transformers (plot reads only the run directory's files).
_LOADING_A_MODEL = ("train", "eval", "bench", "serve")


def interpreter_problem(command: str) -> Optional[str]:
    """Why this interpreter cannot run `command`, or None: under `python -OO` (docstrings stripped) transformers
    raised, as it defined a model's classes, "No `Args` or `Parameters` section is found in the docstring of
    BaseModelOutputWithPast", after the imports and the run directory's start."""
    if sys.flags.optimize >= 2 and command in _LOADING_A_MODEL:
        return ("python -OO strips the docstrings transformers reads as it defines a model's classes, so no model "
                "can load; run it without -OO (python -O is fine)")
    return None


def _command(argv: Optional[Sequence[str]]) -> int:
    problem = working_directory_problem()  # before anything resolves a path or loads a library
    if problem is not None:
        print(f"grpo-engine: {problem}", file=sys.stderr)
        return 1
    missing = missing_engine_packages()
    if missing:
        print(f"grpo-engine needs the engine extra; missing: {', '.join(missing)}. {_site_left_out() or ''}"
              f"Install it: {INSTALL_ENGINE}", file=sys.stderr)
        return 1
    from .config import ConfigError  # the engine extra's pydantic and pyyaml are installed: checked above
    from .launch_env import check_environment

    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(join_flag_values(sys.argv[1:] if argv is None else argv, parser))
    except CommandLineError as exc:  # said in one line by the parser
        return exc.code
    if unknown:
        print(f"grpo-engine {args.command}: {unknown_arguments_message(parser, args.command, unknown)}",
              file=sys.stderr)
        return 2
    problem = interpreter_problem(args.command)
    if problem is not None:
        print(f"grpo-engine {args.command}: {problem}", file=sys.stderr)
        return 2
    handlers = {"train": _train, "eval": _eval, "plot": _plot, "bench": _bench, "serve": _serve}
    try:
        check_environment()  # the launchers' and libraries' variables, before anything reads them
        check_address_space(args.command)  # before torch's import, which a small ulimit -v stops unclearly
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"grpo-engine: config error: {exc}", file=sys.stderr)
        return 2
    except TrainingInterrupted as exc:
        output_dir = exc.checkpoint.parent.parent
        # a launched run resumes only with as many processes (check_saved_processes): the plain command's hint,
        # followed under torchrun, started one process and was refused
        world = os.environ.get("WORLD_SIZE", "1")
        launcher = f", under the same launcher with {world} processes" if world.isdigit() and int(world) > 1 else ""
        print(f"grpo-engine train: {exc}. Continue with: grpo-engine train --resume --output-dir {output_dir} "
              f"(and the same options{launcher})", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print(f"grpo-engine {args.command}: interrupted; a training run continues from its last checkpoint with "
              f"--resume", file=sys.stderr)
        return 130
    except (MemoryError, *NAMED_FAILURES) as exc:  # the engine's own errors name their cause: one line
        return failure_status(exc, f"grpo-engine {args.command}")


if __name__ == "__main__":
    sys.exit(main())
