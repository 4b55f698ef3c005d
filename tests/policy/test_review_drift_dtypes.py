"""An outside review: fit_drift_arrays takes "numpy arrays of integers"; any integer dtype gives the fit by definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy.drift import fit_drift_arrays

from .test_drift import fit_drift_by_definition

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_array_fit_is_the_fit_by_definition_for_every_integer_dtype(dtype, data):
    # uint32 once wrapped an overrun below zero to 4,294,967,038; int16 overflowed est * drift; uint64 raised
    info = np.iinfo(dtype)
    value = st.integers(max(0, int(info.min)), min(int(info.max), 10**15))
    rows = data.draw(st.lists(st.tuples(value, value), min_size=1, max_size=40))
    est = np.array([e for e, _ in rows], dtype=dtype)
    actual = np.array([a for _, a in rows], dtype=dtype)
    assert fit_drift_arrays(est, actual) == fit_drift_by_definition(rows)


def test_the_array_fit_of_unsigned_values_past_int64_is_exact():
    rows = [(2**63 + 5, 2**64 - 1), (1, 3)]
    est = np.array([e for e, _ in rows], dtype=np.uint64)
    actual = np.array([a for _, a in rows], dtype=np.uint64)
    assert fit_drift_arrays(est, actual) == fit_drift_by_definition(rows)
