#!/usr/bin/env python3
"""Tests of dev/gpu_coredump.py on synthetic core dumps: ELF files built here with the table layout the
script reads (a grid, a CTA, a warp and its lanes, and a cubin image whose .text section holds the PC)."""
import os
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import gpu_coredump as gc  # noqa: E402


def build_elf(sections):
    """A little-endian ELF64 file from [(name, type, addr, data, link, info, entsize)]; section 0 is the
    null section and the last one the section-name table."""
    names = b"\0"
    offsets = []
    for s in sections:
        offsets.append(len(names))
        names += s[0].encode() + b"\0"
    shstr_name = len(names)
    names += b".shstrtab\0"
    body = b""
    placed = []
    base = 64
    for s in sections:
        placed.append(base + len(body))
        body += s[3]
    shstr_off = base + len(body)
    body += names
    shoff = base + len(body)
    shnum = len(sections) + 2
    header = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    header += struct.pack("<HHIQQQIHHHHHH", 4, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, shnum, shnum - 1)
    shdrs = b"\0" * 64
    for s, name_off, off in zip(sections, offsets, placed):
        name, type_, addr, data, link, info, entsize = s
        shdrs += struct.pack("<IIQQQQIIQQ", name_off, type_, 0, addr, off, len(data), link, info, 1, entsize)
    shdrs += struct.pack("<IIQQQQIIQQ", shstr_name, 3, 0, 0, shstr_off, len(names), 0, 0, 1, 0)
    return header + body + shdrs


def cubin(functions):
    """A cubin-like image: one .text.<name> section per (name, addr, size)."""
    return build_elf([(".text." + n, 1, addr, b"\0" * size, 0, 0, 0) for n, addr, size in functions])


def core(lanes, warp_error_pc=0, functions=(("kern_a", 0x7000, 0x100), ("kern_b", 0x9000, 0x200)), entsize_extra=0):
    """A core with one grid (id 7), one CTA (block (3, 1, 0)), one warp whose lanes are
    [(pc, thread_x, exception)]; rows padded by entsize_extra bytes, as newer drivers write them."""
    pad = b"\0" * entsize_extra
    grid = struct.pack(gc.GRID_FMT, 7, 1, 0, functions[1][1], 0, 0, 0, 0, 0, 0, 40, 96, 1, 1, 64, 1, 1) + pad
    cta = struct.pack(gc.CTA_FMT, 7, 3, 1, 0) + pad
    warp = struct.pack(gc.WARP_FMT, warp_error_pc, 2, 0xFFFFFFFF, 0xFFFFFFFF, 0, 1 if warp_error_pc else 0) + pad
    lane_rows = b"".join(struct.pack(gc.LANE_FMT, pc, 0, i, tx, 0, 0, exc, 0) + pad
                         for i, (pc, tx, exc) in enumerate(lanes))
    # section indices: 1 grid, 2 cta, 3 warp, 4 lanes, 5 image
    return build_elf([
        (".cudbg.gridtbl", gc.SEC_GRID, 0, grid, 0, 0, len(grid)),
        (".cudbg.ctatbl.dev0.sm5", gc.SEC_CTA, 0, cta, 0, 0, len(cta)),
        (".cudbg.wptbl.dev0.sm5.cta0", gc.SEC_WARP, 0, warp, 2, 0, len(warp)),
        (".cudbg.lntbl.dev0.sm5.wp2", gc.SEC_LANE, 0, lane_rows, 3, 0, struct.calcsize(gc.LANE_FMT) + len(pad)),
        (".cudbg.relfimg.dev0.ctx1", gc.SEC_RELOCATED_IMAGE, 0, cubin(functions), 0, 0, 0),
    ])


def faults_of(data):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        path = f.name
    try:
        return gc.read_core(path)
    finally:
        os.unlink(path)


class CoreDumpTest(unittest.TestCase):
    def test_faulting_lanes_name_their_function_offset_and_exception(self):
        faults = faults_of(core([(0x9040, 0, 14), (0x9040, 1, 14), (0x9000, 2, 0)]))
        self.assertEqual(len(faults), 1)
        f = faults[0]
        self.assertEqual(f["function"], "kern_b")
        self.assertEqual(f["offset"], 0x40)
        self.assertEqual(f["exception_name"], "warp illegal address")
        self.assertEqual(f["grid"]["grid_dim"], (96, 1, 1))
        self.assertEqual([l[1][0] for l in f["lanes"]], [0, 1])   # the lane without an exception is left out
        self.assertEqual(f["lanes"][0][0], (3, 1, 0))

    def test_warp_error_pc_wins_over_the_lane_pc(self):
        f = faults_of(core([(0x9100, 0, 5)], warp_error_pc=0x7010))[0]
        self.assertEqual((f["function"], f["offset"]), ("kern_a", 0x10))
        self.assertIn("out-of-range", f["exception_name"])

    def test_longer_rows_of_newer_drivers(self):
        f = faults_of(core([(0x7020, 4, 6)], entsize_extra=24))[0]
        self.assertEqual((f["function"], f["offset"], f["lanes"][0][1][0]), ("kern_a", 0x20, 4))

    def test_pc_outside_every_image_falls_back_to_the_grid_entry(self):
        f = faults_of(core([(0x12345, 0, 4)]))[0]
        self.assertEqual(f["function"], "kern_b")   # the grid's function entry 0x9000
        self.assertEqual(f["offset"], 0x12345 - 0x9000)

    def test_no_exception_and_not_a_core(self):
        self.assertEqual(faults_of(core([(0x7000, 0, 0)])), [])
        self.assertIn("no lane", gc.describe([]))
        with self.assertRaises(ValueError):
            faults_of(b"not an elf file at all")


class RunTest(unittest.TestCase):
    """--run: the command gets the core-dump variables, its exit status is passed on, its cores are read."""

    def run_main(self, argv):
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = gc.main(argv)
        return rc, out.getvalue()

    def test_a_faulting_command_s_core_is_read(self):
        with tempfile.NamedTemporaryFile(delete=False) as f:
            f.write(core([(0x9040, 0, 14)]))
            src = f.name
        # a stand-in for a faulting GPU program: it writes a core where the variables say, then fails
        script = ("import os, shutil, sys; assert os.environ['CUDA_ENABLE_COREDUMP_ON_EXCEPTION'] == '1'; "
                  "shutil.copy(sys.argv[1], os.environ['CUDA_COREDUMP_FILE'].replace('%p', str(os.getpid()))); sys.exit(3)")
        try:
            rc, out = self.run_main(["--run", sys.executable, "-c", script, src])
        finally:
            os.unlink(src)
        self.assertEqual(rc, 3)
        self.assertIn("exited with status 3", out)
        self.assertIn("kern_b +0x40", out)
        self.assertIn("warp illegal address", out)
        folder = out.split("GPU cores in ")[1].split()[0]
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)

    def test_a_command_without_a_core(self):
        rc, out = self.run_main(["--run", sys.executable, "-c", "import sys; sys.exit(5)"])
        self.assertEqual(rc, 5)
        self.assertIn("no GPU core was written", out)
        rc, out = self.run_main(["--run", sys.executable, "-c", "pass"])
        self.assertEqual(rc, 0)


if __name__ == "__main__":
    unittest.main()
