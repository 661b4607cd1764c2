#!/usr/bin/env python3
"""launch.py - rewrite kernel<<<grid, block[, shared, stream]>>>(args) as
emu::launch(grid, block[, shared, stream], [=] { kernel(args); })
so that a .cu file compiles as C++ against the emulator (stdin to stdout)."""
import re, sys

src = sys.stdin.read()
out, i = [], 0
pat = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*<<<')
while True:
    m = pat.search(src, i)
    if not m:
        out.append(src[i:])
        break
    out.append(src[i:m.start()])
    cfg_end = src.index('>>>', m.end())
    cfg = src[m.end():cfg_end]
    j = cfg_end + 3
    while src[j].isspace():
        j += 1
    assert src[j] == '(', 'launch without arguments'
    depth, k = 0, j
    while True:
        if src[k] == '(':
            depth += 1
        elif src[k] == ')':
            depth -= 1
            if depth == 0:
                break
        k += 1
    args = src[j + 1:k]
    # By value: a captured launch runs later, after the caller's locals are gone.
    out.append('emu::launch(%s, [=]() { %s(%s); })' % (cfg, m.group(1), args))
    i = k + 1
sys.stdout.write(''.join(out))
