"""Runs a command on a pseudo-terminal and renders what it wrote as a terminal would show it.

usage: term.py COLUMNS RAW_OUT SCREEN_OUT -- CMD [ARGS...]

The command gets a pty of COLUMNS x 40 as stdin, stdout and stderr. Everything it writes
goes to RAW_OUT unchanged; SCREEN_OUT gets the text a terminal would hold at the end, with
an unbounded scrollback: the escape sequences the live view uses (CR, LF, ESC[nA cursor up,
ESC[J erase to the end of the screen, ESC[K erase to the end of the line) are interpreted;
any other escape sequence makes the script fail, so the test notices new ones. Exits with
the command's exit status.
"""
import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import time


def render(data: bytes, columns: int) -> str:
    rows = [[]]
    row, col = 0, 0
    text = data.decode("utf-8", errors="replace")
    i = 0
    csi = re.compile(r"\x1b\[([0-9;]*)([A-Za-z])")
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            m = csi.match(text, i)
            if not m:
                raise SystemExit(f"unknown escape at offset {i}: {text[i:i + 8]!r}")
            arg, cmd = m.group(1), m.group(2)
            n = int(arg) if arg else 1
            if cmd == "A":
                row = max(0, row - n)
            elif cmd == "J" and arg in ("", "0"):
                del rows[row + 1:]
                del rows[row][col:]
            elif cmd == "K" and arg in ("", "0"):
                del rows[row][col:]
            else:
                raise SystemExit(f"unexpected escape sequence {m.group(0)!r}")
            i = m.end()
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":  # the pty turns it into CR LF (ONLCR)
            row += 1
            if row == len(rows):
                rows.append([])
        else:
            if col >= columns:  # the terminal wraps
                row, col = row + 1, 0
                if row == len(rows):
                    rows.append([])
            line = rows[row]
            while len(line) < col:
                line.append(" ")
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        i += 1
    lines = ["".join(r).rstrip() for r in rows]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def main() -> int:
    columns, raw_path, screen_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    assert sys.argv[4] == "--"
    command = sys.argv[5:]
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer has closed the pty
            break
        if not chunk:
            break
        chunks.append(chunk)
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("term.py: the command ran for more than 120 s")
    status = proc.wait(timeout=30)
    data = b"".join(chunks)
    with open(raw_path, "wb") as f:
        f.write(data)
    with open(screen_path, "w") as f:
        f.write(render(data, columns))
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
