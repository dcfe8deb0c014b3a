#!/usr/bin/env python3
"""launch_with_ports.py DIR N [--names K] [--log PATTERN] CMD [ARGS...]

Binds and listens on N free loopback ports at once and starts N copies of CMD, copy i with
listening socket i handed down (DTF_LISTEN_FD, as dtfrun does): a dtf server listening on that
address takes the socket, so no port is free between its choice and its use. --names K also
picks K more distinct ports, bound (not listening) until every copy has ended, for addresses
nobody listens on (a ps strategy's workers): no port is released while the job runs. In ARGS "{i}" becomes i, "{port}" copy i's port, "{hosts}"
the comma-separated 127.0.0.1:PORT list of the N, "{names}" that of the K.

Writes DIR/ports (the N ports, then the K), then per copy DIR/pid.i once it runs, DIR/started
when all run, and DIR/status.i (its exit status; negative: killed by that signal) when it ends.
Copy i's output goes to PATTERN with {i} replaced (default DIR/out.{i}). Returns when every copy
has ended."""
import os
import socket
import subprocess
import sys

work, n, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names, log = 0, os.path.join(work, "out.{i}")
while rest and rest[0] in ("--names", "--log"):
    if rest[0] == "--names":
        names = int(rest[1])
    else:
        log = rest[1]
    rest = rest[2:]
cmd = rest


def bound(listen):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    if listen:
        s.listen(64)
    return s


def write(name, text):
    with open(os.path.join(work, name + ".tmp"), "w") as f:
        f.write(text + "\n")
    os.rename(os.path.join(work, name + ".tmp"), os.path.join(work, name))


socks = [bound(True) for _ in range(n)]
held = [bound(False) for _ in range(names)]  # held with socks for the whole job: all distinct
ports = [s.getsockname()[1] for s in socks]
name_ports = [s.getsockname()[1] for s in held]
write("ports", " ".join(map(str, ports + name_ports)))
hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
name_list = ",".join(f"127.0.0.1:{p}" for p in name_ports)

children = []
for i, s in enumerate(socks):
    env = dict(os.environ, DTF_LISTEN_FD=str(s.fileno()))
    sub = {"{i}": str(i), "{port}": str(ports[i]), "{hosts}": hosts, "{names}": name_list}
    args = []
    for a in cmd:
        for k, v in sub.items():
            a = a.replace(k, v)
        args.append(a)
    with open(log.replace("{i}", str(i)), "w") as out:
        children.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, pass_fds=[s.fileno()]))
    write(f"pid.{i}", str(children[-1].pid))
for s in socks:
    s.close()  # each copy holds its own now
write("started", hosts)
for i, c in enumerate(children):
    write(f"status.{i}", str(c.wait()))
for s in held:
    s.close()
