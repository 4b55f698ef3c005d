"""The examples in the policy's docstrings run and print what they show (doctest, every module of the package)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import lane_plugin.policy

MODULES = ["lane_plugin.policy"] + [
    f"lane_plugin.policy.{m.name}" for m in pkgutil.iter_modules(lane_plugin.policy.__path__)
]


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name):
    failures, tried = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_the_public_entry_points_show_an_example():
    module = importlib.import_module("lane_plugin.policy")
    missing = [
        n for n in module.__all__ if callable(getattr(module, n)) and ">>>" not in (getattr(module, n).__doc__ or "")
    ]
    assert not missing, missing
