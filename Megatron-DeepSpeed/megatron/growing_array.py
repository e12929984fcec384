"""A numpy array that grows at its end: the per-item bookkeeping of the index writer and the word cache costs a
few bytes an item, not a Python object each, and appending stays amortised constant time (capacity doubles)."""
import numpy as np


class GrowingArray:
    """Rows of `row_shape` (scalars by default) of one dtype, appended at the end; `values` views those held."""

    def __init__(self, dtype, row_shape=()):
        self._buffer = np.empty((1024, *row_shape), dtype=dtype)
        self.size = 0

    def _reserve(self, extra: int) -> None:
        needed = self.size + extra
        if needed > len(self._buffer):
            grown = np.empty((max(needed, 2 * len(self._buffer)), *self._buffer.shape[1:]), dtype=self._buffer.dtype)
            grown[:self.size] = self._buffer[:self.size]
            self._buffer = grown

    def append(self, value) -> None:
        self._reserve(1)
        self._buffer[self.size] = value
        self.size += 1

    def extend(self, rows) -> None:
        self._reserve(len(rows))
        self._buffer[self.size:self.size + len(rows)] = rows
        self.size += len(rows)

    @property
    def values(self) -> np.ndarray:
        return self._buffer[:self.size]
