"""The one line a command's failure becomes, for `grpo-engine` and for every `python -m` tool and benchmark
(grpo_engine/tools/, benchmarks/): the program, then what failed, never a traceback.

The tools and benchmarks had no such boundary: a results file that does not exist given to
`python -m benchmarks.model.calibrate` (the ResultsFileError meant as its one line), an --update-readme that is a
directory, `python -m benchmarks.gpu_plan | head -1` (BrokenPipeError), a stdout closed with `>&-` (sys.stdout is
None) or on /dev/full, a config the tool builds from its flags that the schema refuses: each ended in a traceback of
fifteen lines or more, the one that says what is wrong the last.
"""

from __future__ import annotations

import errno
import signal
import sys
from typing import Callable, Optional

from .address_space import is_out_of_memory, out_of_memory_message
from .messages import has_no_reader, reader_gone
from .standard_streams import guard_output, lost_output, open_closed_streams

# What a command's own code raises for a cause it can name (the engine's errors subclass these). Anything else is a
# bug, whose traceback is what its report needs.
NAMED_FAILURES = (OSError, ValueError, RuntimeError, ImportError, FloatingPointError)


def failure_status(exc: BaseException, prog: str) -> int:
    """Says `exc` on stderr in one line starting with `prog` and returns the exit status: 141 (quietly) for stdout's
    reader gone (`| head`), 1 otherwise."""
    if isinstance(exc, BrokenPipeError) and has_no_reader(sys.stdout):  # end quietly, as a Unix tool does (not a
        reader_gone(sys.stdout)                                          # server's socket's pipe)
        return 128 + signal.SIGPIPE
    if isinstance(exc, MemoryError) or is_out_of_memory(exc):  # a library the loader could not map: the address space
        print(out_of_memory_message(None, prog=prog), file=sys.stderr)
        return 1
    text = " ".join(str(exc).split())  # a library's error text (transformers', torch's) may span several lines
    if getattr(exc, "errno", None) == errno.EFBIG:  # past the file-size limit: say which limit, not just "too large"
        from .state.file_size_limit import file_size_limit, limit_text

        limit = file_size_limit()
        cause = f"this process may write {limit_text(limit)}" if limit is not None else "a file got too large"
        print(f"{prog}: {text} ({cause}: raise the limit with ulimit -f unlimited and run again)", file=sys.stderr)
        return 1
    # A reward function's own traceback is the exception: the bug is in the user's code.
    if getattr(exc, "user_traceback", None):
        print(exc.user_traceback, file=sys.stderr, end="")
    print(f"{prog}: {type(exc).__name__}: {text}", file=sys.stderr)
    return 1


def run_tool(main: Callable[[], Optional[int]], prog: str) -> int:
    """`main()` (a tool's, reading sys.argv) as a program: closed standard streams opened on /dev/null, the
    environment's variables checked as `grpo-engine` checks them, an unwritable stdout said at the end, and any
    failure of NAMED_FAILURES one line (failure_status). argparse's own exits (--help, an argument error: already one
    line) pass through."""
    open_closed_streams()
    guard_output()
    try:
        from .launch_env import check_environment

        check_environment()  # OMP_NUM_THREADS=abc and the like, refused as `grpo-engine` refuses them
        code = main() or 0
        sys.stdout.flush()  # here, not at the interpreter's exit, where a failure is an "Exception ignored" traceback
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, *NAMED_FAILURES) as exc:
        return failure_status(exc, prog)
    lost = lost_output()
    if lost is not None and code == 0:
        print(f"{prog}: {lost}", file=sys.stderr)
        return 1
    return code
