#!/usr/bin/env python3
"""Unit tests of dev/bench/kernel_table.py that need no GPU and no ncu:

    python3 dev/bench/test_kernel_table.py

CSV text in the layout of `ncu --csv --page raw` (ncu's own '==PROF==' lines, the header, the units
row, durations with thousands separators): the kernels of the last step only, names without
templates and parameters, sums and launch counts per name, the totals, two files side by side, and
the errors (no header, no step start, a missing file: a message and exit status 1; labels that do not
match the files).
"""
import io
import os
import sys
import tempfile
import textwrap
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_table  # noqa: E402

HEADER = '"ID","Process ID","Kernel Name","Grid Size","gpu__time_duration.sum"\n'
UNITS = '"","","","","nsecond"\n'


def ncu_csv(launches):
    rows = [f'"{i}","7","{name}","(1, 1, 1)","{ns}"\n' for i, (name, ns) in enumerate(launches)]
    return "==PROF== Connected to process 7\n" + HEADER + UNITS + "".join(rows) + "==PROF== Disconnected\n"


STEP1 = [("void encoder_forward_kernel<(int)4>(float *, const int *)", "1,000"),
         ("fp8_gemm::fc_gelu_ws_kernel(CUtensorMap_st, int)", "9,999,999")]
STEP2 = [("void encoder_forward_kernel<(int)4>(float *, const int *)", "2,000"),
         ("fp8_gemm::fc_gelu_ws_kernel(CUtensorMap_st, int)", "437,000"),
         ("void flash_detail::flash_bwd_dq_wgmma_kernel<Id>(bf16 *)", "500,000"),
         ("fp8_gemm::fc_gelu_ws_kernel(CUtensorMap_st, int)", "436,000")]


class KernelTableTest(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_short_names(self):
        self.assertEqual(kernel_table.short_name("void encoder_forward_kernel<(int)4>(float *, const int *)"),
                         "encoder_forward_kernel")
        self.assertEqual(kernel_table.short_name("void flash_detail::k<A<B>, 3>(bf16 *)"), "flash_detail::k")
        self.assertEqual(kernel_table.short_name("fp8_gemm::fc_dy_ws_kernel(CUtensorMap_st)"), "fp8_gemm::fc_dy_ws_kernel")

    def test_last_step_sums(self):
        path = self.write(ncu_csv(STEP1 + STEP2))
        launches = kernel_table.read_launches(path)
        self.assertEqual(len(launches), 6)
        sums = kernel_table.summarize(kernel_table.last_step(launches, "encoder_forward"))
        self.assertEqual(sums["fp8_gemm::fc_gelu_ws_kernel"], (873000.0, 2))  # step 1's launch left out
        self.assertEqual(sums["encoder_forward_kernel"], (2000.0, 1))
        self.assertEqual(sums["flash_detail::flash_bwd_dq_wgmma_kernel"], (500000.0, 1))

    def test_two_columns(self):
        a = self.write(ncu_csv(STEP2))
        b = self.write(ncu_csv(STEP2[:2]))
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(kernel_table.main([a, b, "--labels", "fp8,bf16"]), 0)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], "| kernel | fp8 ms (launches) | bf16 ms (launches) |")
        self.assertEqual(lines[2], "| `fp8_gemm::fc_gelu_ws_kernel` | 0.873 (2) | 0.437 (1) |")  # largest first
        self.assertEqual(lines[3], "| `flash_detail::flash_bwd_dq_wgmma_kernel` | 0.500 (1) |  |")
        self.assertEqual(lines[-1], "| total | **1.375** (4) | **0.439** (2) |")

    def test_errors(self):
        with self.assertRaises(ValueError):
            kernel_table.read_launches(self.write("==PROF== nothing profiled\n"))
        path = self.write(ncu_csv(STEP2))
        with self.assertRaises(ValueError):
            kernel_table.last_step(kernel_table.read_launches(path), "no_such_kernel")
        err = io.StringIO()
        with redirect_stderr(err), self.assertRaises(SystemExit):
            kernel_table.main([path, "--labels", "a,b"])
        self.assertIn("one name per file", err.getvalue())
        # the command line: a clear message and exit status 1, not a traceback
        for args, says in (([self.write("not ncu output\n")], "no ncu raw CSV header"),
                           ([path, "--step-start", "no_such_kernel"], "no kernel matches"),
                           (["/no/such/file.csv"], "No such file")):
            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                self.assertEqual(kernel_table.main(args), 1)
            self.assertIn("error: ", err.getvalue())
            self.assertIn(says, err.getvalue())


if __name__ == "__main__":
    unittest.main()
