"""Every public module's docstring examples run and give the printed results."""
import doctest
import importlib

import pytest

import torchrl_seqchunk

MODULES = sorted({f"torchrl_seqchunk.{m}" for m in torchrl_seqchunk._EXPORTS.values()})


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
