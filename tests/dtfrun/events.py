"""Synchronisation for the dtfrun tests' task programs, without sleeps.

An event is a FIFO the test creates beforehand (new_event in lib.sh) with one waiter.
fire() opens it for writing, which blocks until the waiter has it open, so the event is not
lost whichever side comes first; wait() opens it read-write (never blocks) and waits for the
line, up to a deadline. park() is a task body that runs until a signal ends it.

Command line (extra arguments are ignored: they mark the process for pgrep):
  events.py fire PATH [--message TEXT]      fire the event (TEXT is what wait prints)
  events.py wait PATH [--timeout S] [--print]  wait for it (--print: print its message);
                                             exit 9 on timeout
  events.py wait-exit PID [--timeout S]      wait until process PID has ended; exit 9 on timeout
  events.py park [--ready] [--ignore-term] [--term-message TEXT] [--fire PATH]
                                             run until signalled; print "ready" first, ignore
                                             SIGTERM, or print TEXT and exit 0 on SIGTERM, and
                                             fire PATH once the handlers are in place
"""
import os
import select
import signal
import sys

DEFAULT_TIMEOUT_S = 30.0


def fire(path, message="go", timeout_s=DEFAULT_TIMEOUT_S):
    # Opening a FIFO for writing waits for a reader; the alarm bounds that wait (SIGALRM's
    # default action ends the process, which the waiting side then sees as a missing event).
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    with open(path, "w") as f:
        f.write(message + "\n")
    signal.setitimer(signal.ITIMER_REAL, 0)


def wait(path, timeout_s=DEFAULT_TIMEOUT_S):
    """The event's message, or None when the deadline passed first."""
    fd = os.open(path, os.O_RDWR)
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            return None
        return os.read(fd, 4096).decode().splitlines()[0]
    finally:
        os.close(fd)


def wait_exit(pid, timeout_s=DEFAULT_TIMEOUT_S):
    """True once process pid has ended (a pidfd becomes readable), False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        return bool(ready)
    finally:
        os.close(fd)


def park(ready=False, ignore_term=False, term_message=None, fire_path=None):
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif term_message is not None:
        def on_term(sig, frame):
            print(term_message, flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
    if ready:
        print("ready", flush=True)
    if fire_path is not None:
        fire(fire_path)
    while True:
        signal.pause()


def _option(args, name, default=None):
    if name in args:
        i = args.index(name)
        return args[i + 1]
    return default


def main(argv):
    command, args = argv[1], argv[2:]
    timeout_s = float(_option(args, "--timeout", DEFAULT_TIMEOUT_S))
    if command == "fire":
        fire(args[0], _option(args, "--message", "go"), timeout_s)
    elif command == "wait":
        message = wait(args[0], timeout_s)
        if message is None:
            sys.exit(9)
        if "--print" in args:
            print(message, flush=True)
    elif command == "wait-exit":
        sys.exit(0 if wait_exit(int(args[0]), timeout_s) else 9)
    elif command == "park":
        park("--ready" in args, "--ignore-term" in args, _option(args, "--term-message"),
             _option(args, "--fire"))
    else:
        sys.exit("events.py: unknown command " + command)


if __name__ == "__main__":
    main(sys.argv)
