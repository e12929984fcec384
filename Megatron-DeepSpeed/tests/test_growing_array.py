"""GrowingArray keeps every appended row, in order, across the reallocations that grow it."""
import numpy as np

from megatron.growing_array import GrowingArray


def test_rows_survive_growth_in_order():
    array = GrowingArray(np.int64, (2,))
    expected = np.arange(6000, dtype=np.int64).reshape(-1, 2)
    array.append(expected[0])
    array.extend(expected[1:1500])  # past the first capacity
    for row in expected[1500:]:
        array.append(row)
    assert array.size == 3000 and array.values.dtype == np.int64
    assert np.array_equal(array.values, expected)
    array.extend(np.empty((0, 2), dtype=np.int64))
    assert array.size == 3000
