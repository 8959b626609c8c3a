#!/usr/bin/env python3
"""gpu_coredump.py: which kernel faulted, where and how, read from a CUDA GPU core dump without cuda-gdb.

A process run with CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 writes a GPU core dump when a kernel faults
(an illegal address, a misaligned access, an illegal instruction, ...). cuda-gdb reads it
(`target cudacore FILE`), but the GPU machines of this project have no cuda-gdb. This script reads
the few tables that name the fault:

  * the core is an ELF file whose sections hold tables (section types SHT_LOUSER + n): devices, SMs,
    grids (kernel launches), CTAs, warps and lanes. A table's rows have the section's sh_entsize
    bytes (newer drivers append fields; the leading ones, read here, keep their places). A child
    table names its parent row: sh_link is the parent table's section, sh_info the row. So a lane
    table belongs to one warp, a warp table to one CTA, and a CTA row names its grid.
  * a lane row holds the lane's PC and its exception code; a warp row the warp's error PC.
  * the loaded GPU code is there as ELF images (cubins) whose code sits at its load addresses
    (the "relocated" images): the function whose .text section holds the PC is the faulting one.

Usage, on the machine that ran the program:
    CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_COREDUMP_FILE=/tmp/core_%p \\
    CUDA_COREDUMP_GENERATION_FLAGS=skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory \\
        ./train_gpt_nvfp4 ...
    python3 dev/gpu_coredump.py /tmp/core_1234 [--sass]
or both in one:
    python3 dev/gpu_coredump.py --sass --run ./train_gpt_nvfp4 ...
which runs the command with those variables (cores in a fresh temporary folder, kept when written),
passes its exit status on, and reads whatever cores it left.
--sass disassembles the faulting function (cuobjdump from the CUDA toolkit, on the image taken out of
the core) and prints the instructions around the fault.
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

SHT_LOUSER = 0x80000000
# the table and image sections of a CUDA core dump (the driver's numbering)
SEC_ELF_IMAGE, SEC_RELOCATED_IMAGE = SHT_LOUSER + 6, SHT_LOUSER + 7
SEC_DEVICE, SEC_SM, SEC_GRID, SEC_CTA, SEC_WARP, SEC_LANE = (SHT_LOUSER + n for n in (9, 11, 12, 13, 14, 15))

# the exception codes of a lane (the CUDA debugger API's numbering)
EXCEPTIONS = {
    0: "none",
    1: "lane illegal address",
    2: "lane user stack overflow",
    3: "device hardware stack overflow",
    4: "warp illegal instruction",
    5: "warp out-of-range address (shared or local memory window)",
    6: "warp misaligned address",
    7: "warp invalid address space",
    8: "warp invalid PC",
    9: "warp hardware stack overflow",
    10: "device illegal address",
    11: "lane misaligned address",
    12: "warp assert",
    13: "lane syscall error",
    14: "warp illegal address",
    15: "lane non-migratable system atomic",
    16: "lane invalid system atomic",
    17: "cluster out-of-range address",
    18: "cluster block not present",
    19: "warp stack canary",
    0xFFFFFFFF: "unknown",
}


class Section:
    def __init__(self, name, type_, addr, offset, size, link, info, entsize):
        self.name, self.type, self.addr, self.offset = name, type_, addr, offset
        self.size, self.link, self.info, self.entsize = size, link, info, entsize


def elf_sections(data):
    """The section headers of a little-endian ELF64 image, with their names."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = []
    for i in range(shnum):
        name, type_, _flags, addr, offset, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        raw.append((name, type_, addr, offset, size, link, info, entsize))
    strtab_off, strtab_size = (raw[shstrndx][3], raw[shstrndx][4]) if shnum else (0, 0)

    def name_at(i):
        end = data.index(b"\0", strtab_off + i, strtab_off + strtab_size)
        return data[strtab_off + i:end].decode("latin-1")
    return [Section(name_at(r[0]), *r[1:]) for r in raw]


def table_rows(data, sec, default_size):
    """The rows of a table section, each as bytes padded with zeros to at least default_size."""
    size = sec.entsize or default_size
    rows = []
    for i in range(sec.size // size):
        row = data[sec.offset + i * size:sec.offset + (i + 1) * size]
        rows.append(row + b"\0" * max(0, default_size - len(row)))
    return rows


GRID_FMT = "<QQQQQQQIIIIIIIIII"   # gridId64 contextId function functionEntry moduleHandle parentGridId64
                                  # paramsOffset kernelType origin gridStatus numRegs gridDim[3] blockDim[3]
CTA_FMT = "<QIII"                 # gridId64 blockIdx[3]
WARP_FMT = "<QIIIII"              # errorPC warpId validLanesMask activeLanesMask isWarpBroken errorPCValid
LANE_FMT = "<QQIIIIII"            # virtualPC physPC ln threadIdx[3] exception callDepth


def image_functions(image):
    """(start, end, name) of each function of a cubin: its .text.<name> section at the section's
    address, or its symbol (STT_FUNC) where the sections carry no address."""
    try:
        secs = elf_sections(image)
    except (ValueError, struct.error):
        return []
    funcs = [(s.addr, s.addr + s.size, s.name[len(".text."):]) for s in secs
             if s.name.startswith(".text.") and s.addr]
    if funcs:
        return funcs
    for s in secs:
        if s.type != 2:   # SHT_SYMTAB
            continue
        strsec = secs[s.link]
        for i in range(s.size // 24):
            st_name, st_info, _other, _shndx, value, size = struct.unpack_from("<IBBHQQ", image, s.offset + 24 * i)
            if st_info & 0xF == 2 and size:
                end = image.index(b"\0", strsec.offset + st_name)
                funcs.append((value, value + size, image[strsec.offset + st_name:end].decode("latin-1")))
    return funcs


def demangle(name):
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not name.startswith("_Z"):
        return name
    try:
        return subprocess.run([tool, name], capture_output=True, text=True, timeout=10).stdout.strip() or name
    except (OSError, subprocess.SubprocessError):
        return name


def read_core(path):
    """The faults of a core: a list of dicts, one per (grid, PC, exception), with the lanes found there."""
    with open(path, "rb") as f:
        data = f.read()
    secs = elf_sections(data)
    grids = {}
    for s in secs:
        if s.type == SEC_GRID:
            for row in table_rows(data, s, struct.calcsize(GRID_FMT)):
                f = struct.unpack_from(GRID_FMT, row)
                grids[f[0]] = {"function_entry": f[3], "grid_dim": f[11:14], "block_dim": f[14:17], "regs": f[10]}
    images = []   # (start, end, name, image bytes)
    for s in secs:
        if s.type in (SEC_RELOCATED_IMAGE, SEC_ELF_IMAGE):
            img = data[s.offset:s.offset + s.size]
            images += [(a, b, n, img) for a, b, n in image_functions(img)]

    def function_at(pc):
        for a, b, n, img in images:
            if a <= pc < b:
                return n, pc - a, img
        return None, None, None

    faults = {}
    for s in secs:
        if s.type != SEC_LANE:
            continue
        warp_sec = secs[s.link] if s.link < len(secs) else None
        warp = cta = None
        if warp_sec is not None and warp_sec.type == SEC_WARP:
            wrows = table_rows(data, warp_sec, struct.calcsize(WARP_FMT))
            if s.info < len(wrows):
                warp = struct.unpack_from(WARP_FMT, wrows[s.info])
            cta_sec = secs[warp_sec.link] if warp_sec.link < len(secs) else None
            if cta_sec is not None and cta_sec.type == SEC_CTA:
                crows = table_rows(data, cta_sec, struct.calcsize(CTA_FMT))
                if warp_sec.info < len(crows):
                    cta = struct.unpack_from(CTA_FMT, crows[warp_sec.info])
        for row in table_rows(data, s, struct.calcsize(LANE_FMT)):
            pc, _phys, lane, tx, ty, tz, exc, _depth = struct.unpack_from(LANE_FMT, row)
            if exc == 0:
                continue
            error_pc = warp[0] if warp is not None and warp[5] else None
            fault_pc = error_pc if error_pc else pc
            grid_id = cta[0] if cta is not None else None
            key = (grid_id, fault_pc, exc)
            if key not in faults:
                name, offset, img = function_at(fault_pc)
                grid = grids.get(grid_id, {})
                if name is None and grid.get("function_entry"):
                    name, _, img = function_at(grid["function_entry"])
                    offset = fault_pc - grid["function_entry"] if name else None
                faults[key] = {"grid_id": grid_id, "pc": fault_pc, "exception": exc,
                               "exception_name": EXCEPTIONS.get(exc, "code %d" % exc), "function": name,
                               "offset": offset, "image": img, "grid": grid, "lanes": []}
            block = cta[1:4] if cta is not None else None
            faults[key]["lanes"].append((block, (tx, ty, tz), lane))
    return list(faults.values())


def sass_around(image, function, offset, context=8):
    """The SASS lines of `function` within `context` instructions of `offset` (cuobjdump on the image)."""
    tool = shutil.which("cuobjdump") or (os.path.join(os.environ["CUDA_HOME"], "bin", "cuobjdump")
                                         if "CUDA_HOME" in os.environ else None)
    if not tool or not os.path.exists(tool):
        return ["(no cuobjdump: install the CUDA toolkit, or pass --no-sass)"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(image)
        path = f.name
    try:
        out = subprocess.run([tool, "-sass", path], capture_output=True, text=True, timeout=120).stdout
    finally:
        os.unlink(path)
    lines, inside = [], False
    for line in out.splitlines():
        if line.strip().startswith("Function :"):
            inside = line.split(":", 1)[1].strip() == function
            continue
        if inside:
            m = re.search(r"/\*([0-9a-f]{4,})\*/", line)
            if m:
                lines.append((int(m.group(1), 16), line.rstrip()))
    near = [text + ("   <-- fault" if off == offset else "") for off, text in lines
            if abs(off - offset) <= context * 16]
    return near or ["(offset 0x%x not found in the disassembly of %s)" % (offset, function)]


def describe(faults, sass=False):
    out = []
    if not faults:
        out.append("no lane with an exception in this core")
    for f in faults:
        name = demangle(f["function"]) if f["function"] else "(function not found in the core's images)"
        where = "+0x%x" % f["offset"] if f["offset"] is not None else ""
        out.append("exception: %s (code %d)" % (f["exception_name"], f["exception"]))
        out.append("  kernel: %s %s (pc 0x%x)" % (name, where, f["pc"]))
        g = f["grid"]
        if g:
            out.append("  grid %s: gridDim %s blockDim %s, %d registers" % (f["grid_id"], g["grid_dim"], g["block_dim"], g["regs"]))
        blocks = sorted({l[0] for l in f["lanes"] if l[0] is not None})
        out.append("  %d lanes, %d blocks, e.g. block %s thread %s" % (len(f["lanes"]), len(blocks),
                                                                     f["lanes"][0][0], f["lanes"][0][1]))
        if sass and f["function"] and f["offset"] is not None and f["image"] is not None:
            out += ["    " + l for l in sass_around(f["image"], f["function"], f["offset"])]
    return "\n".join(out)


# what --run sets: a core per process on a GPU exception, without the memory images (only the tables and
# the loaded code are read here), and no host core
COREDUMP_ENV = {
    "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1",
    "CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION": "0",
    "CUDA_COREDUMP_GENERATION_FLAGS": "skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory",
}


def run_with_coredumps(command, folder):
    """Runs command (a list) with GPU core dumps on, written into folder; returns (exit status, cores)."""
    env = dict(os.environ, CUDA_COREDUMP_FILE=os.path.join(folder, "core_%p"), **COREDUMP_ENV)
    try:
        rc = subprocess.call(command, env=env)
    except OSError as e:
        print("error: cannot run %s: %s" % (command[0], e))
        return 127, []
    cores = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("core_"))
    return rc, cores


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cores", nargs="*", help="GPU core dump files")
    ap.add_argument("--sass", action="store_true", help="disassemble the faulting function around the fault")
    ap.add_argument("--run", nargs=argparse.REMAINDER, metavar="COMMAND",
                    help="run COMMAND with GPU core dumps on, then read the cores it wrote (the rest of the line)")
    args = ap.parse_args(argv)
    if args.run:
        folder = tempfile.mkdtemp(prefix="gpu_cores_")
        rc, cores = run_with_coredumps(args.run, folder)
        if not cores:
            os.rmdir(folder)
            print("gpu_coredump: %s exited with status %d; no GPU core was written" % (args.run[0], rc))
            return rc
        print("gpu_coredump: %s exited with status %d; GPU cores in %s" % (args.run[0], rc, folder))
        args.cores = cores
    elif not args.cores:
        ap.error("give core files, or --run COMMAND")
    else:
        rc = 0
    for path in args.cores:
        print("== %s" % path)
        try:
            print(describe(read_core(path), args.sass))
        except (OSError, ValueError, struct.error) as e:
            print("error: cannot read %s: %s" % (path, e))
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
