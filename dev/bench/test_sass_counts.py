#!/usr/bin/env python3
"""Unit tests of dev/bench/sass_counts.py that need no GPU and no cuobjdump:

    python3 dev/bench/test_sass_counts.py

The SASS parser on text in cuobjdump's layout (predicated instructions, opcodes with modifiers,
uniform predicates, the encoding words and blank lines between instructions, two kernels), the
table with and without a baseline, and the command line's errors (no cuobjdump, no such binary,
no matching kernel) with a stand-in cuobjdump script.
"""
import os
import stat
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_counts  # noqa: E402
from cli_capture import run_captured  # noqa: E402

SASS = textwrap.dedent("""\

    Fatbin elf code:
    ================
    arch = sm_90a
    code version = [1,8]

    \t\tFunction : _Z8kernel_aPf
    \t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
            /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
                                                                                   /* 0x000fe20000000800 */
            /*0010*/                   F2F.BF16.F32 R2, R3 ;                       /* 0x0000000300027304 */
                                                                                   /* 0x000e220000202000 */
            /*0020*/              @!P0 BRA 0x60 ;                                  /* 0x0000000000088947 */
            /*0030*/                   BSSY B0, 0x80 ;                             /* 0x0000004000007945 */
            /*0040*/               @P1 CALL.REL.NOINC 0x200 ;                      /* 0x0000000000007944 */
            /*0050*/                   STL [R1], R2 ;                              /* 0x0000000201007387 */
            /*0060*/                   LDL R4, [R1] ;                              /* 0x0000000001047983 */
            /*0070*/                   F2FP.BF16.F32.PACK_AB R5, R6, R7 ;          /* 0x000000070605723e */
            /*0080*/                   MUFU.EX2 R8, R8 ;                           /* 0x0000000800087308 */
            /*0090*/                   HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR12], RZ ;  /* 0x00e0000c38187df0 */
            /*00a0*/             @!UPT BRA 0xa0 ;                                  /* 0x0000000000fc7947 */
            /*00b0*/                   I2F.U32 R9, R10 ;                           /* 0x0000000a00097306 */
            /*00c0*/                   EXIT ;                                      /* 0x000000000000794d */
            ..........

    \t\tFunction : _Z8kernel_bv
            /*0000*/                   FADD.FTZ R0, R1, 384 ;                      /* 0x4380000001007421 */
            /*0010*/                   F2I.TRUNC.NTZ R2, R0 ;                      /* 0x0000000000027305 */
            /*0020*/                   EXIT ;                                      /* 0x000000000000794d */
    """)


def counts(**nonzero):
    c = {name: 0 for name, _ in sass_counts.COLUMNS}
    c.update({k.replace("_", "/"): v for k, v in nonzero.items()})
    return c


class ParseTest(unittest.TestCase):
    def test_counts_per_kernel(self):
        k = sass_counts.parse_sass(SASS)
        self.assertEqual(list(k), ["_Z8kernel_aPf", "_Z8kernel_bv"])
        self.assertEqual(k["_Z8kernel_aPf"], counts(instr=13, BRA=2, BSSY=1, CALL=1, STL=1, LDL=1, F2F=1, F2FP=1,
                                                     F2I_I2F=1, MUFU=1, MMA=1))
        self.assertEqual(k["_Z8kernel_bv"], counts(instr=3, F2I_I2F=1))

    def test_text_before_the_first_kernel_and_encoding_words_are_not_instructions(self):
        k = sass_counts.parse_sass("/*0000*/ FADD R0, R1, R2 ;\n" + SASS)
        self.assertEqual(k["_Z8kernel_aPf"]["instr"], 13)
        self.assertEqual(sass_counts.parse_sass("no kernels here\n"), {})

    def test_a_kernel_listed_twice_adds_up(self):
        k = sass_counts.parse_sass(SASS + SASS)
        self.assertEqual(k["_Z8kernel_bv"]["instr"], 6)


class TableTest(unittest.TestCase):
    def test_filter_and_baseline(self):
        after = sass_counts.parse_sass(SASS)
        before = {"_Z8kernel_bv": counts(instr=30, BRA=4, F2I_I2F=1)}
        table, n = sass_counts.format_table(after, pattern="kernel_b", baseline=before)
        self.assertEqual(n, 1)
        lines = table.splitlines()
        self.assertEqual(len(lines), 3)
        self.assertTrue(lines[0].startswith("| kernel | instr | BRA |"))
        self.assertIn("30 -> 3", lines[2])
        self.assertIn("4 -> 0", lines[2])
        table, n = sass_counts.format_table(after)   # no filter, no baseline: plain counts
        self.assertEqual(n, 2)
        self.assertIn("| 13 |", table)
        self.assertNotIn("->", table)

    def test_long_names_are_cut(self):
        k = {"x" * 200: counts(instr=1)}
        table, _ = sass_counts.format_table(k, width=40)
        self.assertIn("x" * 37 + "...", table)
        self.assertNotIn("x" * 41, table)


class CommandLineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.binary = os.path.join(self.dir.name, "fake_binary")
        with open(self.binary, "w") as f:
            f.write("not really a binary\n")
        sass_file = os.path.join(self.dir.name, "sass.txt")
        with open(sass_file, "w") as f:
            f.write(SASS)
        # a stand-in cuobjdump: prints the fixture for -sass, fails otherwise
        self.tool = os.path.join(self.dir.name, "cuobjdump")
        with open(self.tool, "w") as f:
            f.write("#!/bin/sh\n[ \"$1\" = -sass ] || exit 3\ncat '%s'\n" % sass_file)
        os.chmod(self.tool, os.stat(self.tool).st_mode | stat.S_IXUSR)

    def tearDown(self):
        self.dir.cleanup()

    def run_main(self, args):
        return run_captured(sass_counts.main, args)

    def test_table_through_the_tool(self):
        rc, out, err = self.run_main([self.binary, "--cuobjdump", self.tool, "--kernel", "kernel_a"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.strip().splitlines()), 3)
        rc, out, err = self.run_main([self.binary, "--cuobjdump", self.tool, "--baseline", self.binary])
        self.assertEqual(rc, 0, err)
        self.assertIn("13 -> 13", out)

    def test_errors(self):
        rc, _, err = self.run_main([self.binary, "--cuobjdump", os.path.join(self.dir.name, "missing")])
        self.assertEqual(rc, 2)
        self.assertIn("cuobjdump not found", err)
        rc, _, err = self.run_main([os.path.join(self.dir.name, "nope"), "--cuobjdump", self.tool])
        self.assertEqual(rc, 2)
        self.assertIn("no such file", err)
        rc, _, err = self.run_main([self.binary, "--cuobjdump", self.tool, "--kernel", "no_such_kernel"])
        self.assertEqual(rc, 1)
        self.assertIn("no kernel", err)


if __name__ == "__main__":
    unittest.main()
