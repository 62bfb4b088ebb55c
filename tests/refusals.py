"""A refused command line run in the test's process: its checks come before any work, so a new
interpreter would only add its start-up."""
import contextlib
import io

import pytest


def refused(call) -> str:
    """The standard error of ``call()``, which must exit with status 2 (a refused command line)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as refusal:
        call()
    assert refusal.value.code == 2, (refusal.value.code, stderr.getvalue()[-3000:])
    return stderr.getvalue()
