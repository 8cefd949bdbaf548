"""Reward functions that never return, each in another way: for the reward time limit's tests."""

import re, socket, sys, threading, time
def sleeps(completions, **kw): time.sleep(1000)
def reads_stdin(completions, **kw): return [float(input())] * len(completions)
def deadlocks(completions, **kw):
    lock = threading.Lock(); lock.acquire(); lock.acquire()
def waits_event(completions, **kw): threading.Event().wait()
def swallows(completions, **kw):
    while True:
        try: time.sleep(10)
        except BaseException: pass
def regex(completions, **kw): re.match(r"(a+)+$", "a" * 60 + "b"); return [0.0] * len(completions)
def busy(completions, **kw):
    while True: pass
def socket_recv(completions, **kw):
    a, b = socket.socketpair(); a.recv(1)


def returns_in_time(completions, **kw):
    return [1.0] * len(completions)


NEVER_RETURN = ("sleeps", "reads_stdin", "deadlocks", "waits_event", "swallows", "regex", "busy", "socket_recv")
# The ones that never see the time limit's exception: the watchdog process ends them.
DEAF = ("swallows", "regex")
