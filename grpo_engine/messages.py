"""The engine's messages to the person running it go through `logging`, each module's logger a child of
"grpo_engine": a program that embeds the engine filters, formats or captures them as any library's log.

`grpo-engine` shows them as they have always read: the message alone, warnings (and worse) on stderr, the
rest (progress notes: resuming, the warm start) on stdout. Without that handler (the engine used as a library,
nothing configured), logging's own fallback still prints warnings to stderr, and notes stay silent.
"""

from __future__ import annotations

import logging
import os
import select
import sys

ENGINE_LOGGER = __name__.rpartition(".")[0]  # the package: every module's logger is its child


class _TerminalHandler(logging.Handler):
    """The message text alone, to the stream a person reads it on; the streams are looked up per message, so a
    redirected sys.stdout / sys.stderr is followed."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except BrokenPipeError:  # its reader has gone (`| head`): the message goes nowhere, the run goes on
            if has_no_reader(stream):
                reader_gone(stream)
            else:
                self.handleError(record)
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


def show_messages() -> None:
    """Show the engine's messages on the terminal, notes included (what `grpo-engine` does first); once."""
    logger = logging.getLogger(ENGINE_LOGGER)
    if not any(isinstance(handler, _TerminalHandler) for handler in logger.handlers):
        handler = _TerminalHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


def reader_gone(stream) -> None:
    """`stream`'s reader has gone (`grpo-engine plot | head -0`): what is still written to it goes nowhere, as for a
    Unix tool that SIGPIPE ends, without a BrokenPipeError at the next write or at Python's flush at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a file descriptor's stream (a capture): nothing to redirect
        pass


def has_no_reader(stream) -> bool:
    """Whether `stream` is a pipe whose reading end is closed (poll reports an error on its writing end)."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # closed, or no file descriptor (a capture)
        return False
