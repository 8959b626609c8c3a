#!/usr/bin/env python3
"""sass_counts.py: what a kernel compiled to, counted from its SASS, without a GPU.

    python3 dev/bench/sass_counts.py BINARY [--kernel REGEX] [--baseline BINARY0] [--cuobjdump PATH]

For every kernel of BINARY whose (mangled) name matches REGEX, prints the number of SASS instructions
and of the ones that say most about an elementwise inner loop:

    BRA     branches; BSSY    reconvergence points (a branch the warp may diverge on)
    CALL    subroutine calls (e.g. the slow path of an IEEE division)
    STL/LDL register spills to local memory
    F2F     one-value conversions (F2F.BF16.F32 and alike; a quarter of the FP32 rate or less on
            Hopper), F2FP two-value packed conversions, F2I/I2F float <-> integer
    MUFU    the special-function unit (ex2, rcp, ...)
    MMA     tensor-core instructions (HGMMA, HMMA, QGMMA, ...)

With --baseline, each kernel of BINARY0 with the same name is printed beside it (before -> after).
A per-element cost shows this way: one branch and reconvergence point per value (say, per attention
score) appears as BRA/BSSY counts in the hundreds.

The counts are static (instructions in the binary, not executed ones): an unrolled loop counts once
per unrolled copy, a loop that is not unrolled once. Compare a kernel with itself before and after a
change, or two instantiations of one template.

cuobjdump is looked for in PATH, $CUDA_HOME/bin, /usr/local/cuda/bin and in Python's site-packages
(the PyPI wheel nvidia-cuda-cuobjdump, `pip install nvidia-cuda-cuobjdump`), or given with --cuobjdump.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

# the columns, and which opcodes (the mnemonic before the first '.') each one counts
COLUMNS = [
    ("instr", None),
    ("BRA", {"BRA", "BRX", "JMP", "JMX"}),
    ("BSSY", {"BSSY"}),
    ("CALL", {"CALL"}),
    ("STL", {"STL"}),
    ("LDL", {"LDL"}),
    ("F2F", {"F2F"}),
    ("F2FP", {"F2FP"}),
    ("F2I/I2F", {"F2I", "I2F"}),
    ("MUFU", {"MUFU"}),
    ("MMA", {"HGMMA", "HMMA", "QGMMA", "IGMMA", "BGMMA", "IMMA", "UTCHMMA", "UTCQMMA", "UTCOMMA"}),
]

FUNCTION_RE = re.compile(r"^\s*Function : (\S+)")
# an instruction line: /*0450*/  [@P0 | @!P1 | @!UPT ...]  OPCODE.MODIFIERS operands ;
INSTRUCTION_RE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(?:\.\S*)?\b")


def parse_sass(text):
    """cuobjdump -sass output -> {kernel name: {column: count}} (kernels in order of appearance)."""
    kernels = {}
    current = None
    for line in text.splitlines():
        m = FUNCTION_RE.match(line)
        if m:
            current = kernels.setdefault(m.group(1), {name: 0 for name, _ in COLUMNS})
            continue
        if current is None:
            continue
        m = INSTRUCTION_RE.match(line)
        if not m:
            continue
        opcode = m.group(1)
        current["instr"] += 1
        for name, opcodes in COLUMNS[1:]:
            if opcode in opcodes:
                current[name] += 1
    return kernels


def find_cuobjdump(explicit=None):
    """The cuobjdump to run, or None."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = []
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates.append(os.path.join(root, "bin", "cuobjdump"))
    for key in ("purelib", "platlib"):
        site = sysconfig.get_paths().get(key)
        if site:
            candidates += sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")))
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    return None


def demangle(names):
    """Readable names through c++filt where it exists (else the mangled ones)."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return dict(zip(names, names))
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    if len(out) != len(names):
        return dict(zip(names, names))
    return dict(zip(names, out))


def format_table(kernels, pattern=None, baseline=None, width=90):
    """Markdown table of the kernels matching pattern; with baseline, 'before -> after' cells."""
    names = [k for k in kernels if pattern is None or re.search(pattern, k)]
    readable = demangle(names)
    header = ["kernel"] + [name for name, _ in COLUMNS]
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" + " ---: |" * len(COLUMNS)]
    for k in names:
        label = readable[k]
        if len(label) > width:
            label = label[:width - 3] + "..."
        cells = []
        for name, _ in COLUMNS:
            after = kernels[k][name]
            if baseline is not None and k in baseline:
                cells.append("%d -> %d" % (baseline[k][name], after))
            else:
                cells.append(str(after))
        rows.append("| " + " | ".join([label] + cells) + " |")
    return "\n".join(rows), len(names)


def sass_of(binary, cuobjdump):
    result = subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError("%s -sass %s failed: %s" % (cuobjdump, binary, result.stderr.strip()[:500]))
    return result.stdout


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="an executable or object with device code (e.g. build/test_q115_attention)")
    ap.add_argument("--kernel", default=None, help="regular expression on the mangled kernel name")
    ap.add_argument("--baseline", default=None, help="the same kernels from this binary, as 'before -> after'")
    ap.add_argument("--cuobjdump", default=None, help="path of cuobjdump")
    ap.add_argument("--width", type=int, default=90, help="truncate kernel names to this many characters")
    args = ap.parse_args(argv)

    tool = find_cuobjdump(args.cuobjdump)
    if tool is None:
        print("error: cuobjdump not found (looked in PATH, $CUDA_HOME/bin, /usr/local/cuda/bin and Python's "
              "site-packages%s); install it with: pip install nvidia-cuda-cuobjdump"
              % (", and at " + args.cuobjdump if args.cuobjdump else ""), file=sys.stderr)
        return 2
    for path in [args.binary] + ([args.baseline] if args.baseline else []):
        if not os.path.isfile(path):
            print("error: %s: no such file" % path, file=sys.stderr)
            return 2
    try:
        kernels = parse_sass(sass_of(args.binary, tool))
        baseline = parse_sass(sass_of(args.baseline, tool)) if args.baseline else None
    except RuntimeError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    table, n = format_table(kernels, args.kernel, baseline, args.width)
    if n == 0:
        print("error: no kernel of %s matches %r (%d kernels in the binary)" % (args.binary, args.kernel, len(kernels)),
              file=sys.stderr)
        return 1
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
