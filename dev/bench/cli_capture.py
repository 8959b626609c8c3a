"""cli_capture.py: a dev tool's main(argv) run with its stdout and stderr captured, for the tools' unit tests."""

import io
from contextlib import redirect_stderr, redirect_stdout


def run_captured(main, argv):
    """Calls main(argv); returns (its return value, what it printed, what it wrote to stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()
