#!/usr/bin/env python3
"""Doxygen's INPUT_FILTER for dtf's headers: a header's opening comment becomes its file page.

Every public header opens with a plain `//` comment (`// dtf/x.hpp — what it is`, then its
overview, examples, thread safety and errors) directly above `#pragma once`. Doxygen reads only
doc comments, so this filter hands it that block as `/** \\file \\verbatim ... \\endverbatim */`:
shown as written (monospace, columns kept), never parsed as Doxygen markup, so prose in it can
never produce a warning. The `#pragma once` line is consumed so that every other line keeps its
number (warnings name the real lines). Any other file passes through unchanged.
"""
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    lines = f.read().split("\n")
k = 0
while k < len(lines) and lines[k].startswith("//") and not lines[k].startswith("///"):
    k += 1
if 0 < k < len(lines) and lines[k].strip() == "#pragma once":
    text = [line[2:] for line in lines[:k]]
    text[0] = "\\verbatim" + text[0]
    text[-1] += " \\endverbatim */"
    lines = ["/** \\file"] + text + lines[k + 1:]
sys.stdout.write("\n".join(lines))
