"""Megatron's "mmap" indexed dataset: the .bin/.idx token files every training run reads.

Byte-compatible with Megatron-LM / Megatron-DeepSpeed, all little-endian:
  .bin  token ids of every item, concatenated without padding, in the dataset dtype.
  .idx  magic b"MMIDIDX\\x00\\x00", version u64 (= 1), dtype code u8, item count N u64,
        doc_idx count D u64, sizes int32[N], pointers int64[N] (byte offset of each item in the
        .bin), doc_idx int64[D] (0, then the item count after each document).

The reader maps both files and hands out views, so a corpus of many GB costs no RAM. The writer
streams tokens to a temporary .bin as they arrive and only renames the finished pair into place, so
an interrupted run never leaves files that look like a valid dataset.
"""
import contextlib
import glob
import logging
import operator
import os
import secrets
import shutil
import socket
import struct
import weakref

import numpy as np

from megatron.errors import InputError
from megatron.files.sole_writer import SoleWriter
from megatron.growing_array import GrowingArray

DTYPE_CODES = {
    1: np.dtype("<u1"),
    2: np.dtype("<i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f8"),
    7: np.dtype("<f4"),
    8: np.dtype("<u2"),
}

_MAGIC = b"MMIDIDX\x00\x00"
_LEGACY_MAGIC = b"TNTIDX\x00\x00"  # Megatron's older "lazy"/"cached" formats
_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, N, D
_CHUNK_ITEMS = 1 << 22  # bounds the temporaries when scanning or writing 100M-item indexes
_MAX_ITEM_TOKENS = np.iinfo(np.int32).max  # sizes are stored as int32
_COPY_BYTES = 16 << 20
_REBUILD_HINT = "re-create it with tools/preprocess_data.py (or tools/merge_datasets.py)"
_log = logging.getLogger(__name__)


def best_fitting_dtype(vocab_size):
    """uint16 halves disk and page-cache use; Megatron switches to int32 at 65500, not 65536."""
    return DTYPE_CODES[8] if vocab_size < 65500 else DTYPE_CODES[4]


def index_file_path(prefix):
    return str(prefix) + ".idx"


def data_file_path(prefix):
    return str(prefix) + ".bin"


def _dtype_code(dtype):
    canonical = np.dtype(dtype).newbyteorder("<")
    for code, known in DTYPE_CODES.items():
        if known == canonical:
            return code
    supported = ", ".join(known.name for known in DTYPE_CODES.values())
    raise InputError(f"dtype {canonical.name} cannot be stored in an indexed dataset; "
                     f"use one of: {supported}")


def _byte_offsets(sizes, itemsize):
    """Yield, chunk by chunk, each item's byte offset in the .bin (exclusive cumulative sum of
    size * itemsize), so writing or checking a huge index needs only chunk-sized temporaries."""
    running = 0
    for start in range(0, len(sizes), _CHUNK_ITEMS):
        nbytes = sizes[start:start + _CHUNK_ITEMS].astype(np.int64) * itemsize
        ends = np.cumsum(nbytes) + running
        yield ends - nbytes
        running = int(ends[-1])


def _as_bytes(array, dtype):
    """A raw little-endian byte view for file.write, without an extra copy when none is needed."""
    return memoryview(np.ascontiguousarray(array, dtype=dtype)).cast("B")


def _discard(paths, writer):
    """Remove a builder's temporaries and let go of its output prefix."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    writer.release()


# ----------------------------------------------------------------------------------------- reader

def _read_header(idx_path):
    """Return (dtype, item count, doc_idx count) or explain why this is not a usable index."""
    with open(idx_path, "rb") as stream:
        header = stream.read(_HEADER.size)
    if header.startswith(_LEGACY_MAGIC):
        raise InputError(f"{idx_path} is a Megatron 'lazy'/'cached' index (magic "
                         f"{_LEGACY_MAGIC!r}); only the 'mmap' format is supported: re-run "
                         f"tools/preprocess_data.py with --dataset-impl mmap")
    magic = header[:len(_MAGIC)]
    if magic != _MAGIC[:len(magic)]:
        raise InputError(f"{idx_path} is not a Megatron 'mmap' index: it starts with {magic!r} "
                         f"instead of {_MAGIC!r}; {_REBUILD_HINT}")
    if len(header) < _HEADER.size:
        raise InputError(f"{idx_path} is truncated: {len(header)} bytes, shorter than the "
                         f"{_HEADER.size}-byte header; {_REBUILD_HINT}")
    _, version, code, n_items, n_docs = _HEADER.unpack(header)
    if version != _VERSION:
        raise InputError(f"{idx_path} has index format version {version}; only version {_VERSION} "
                         f"(Megatron-LM / Megatron-DeepSpeed) is supported: {_REBUILD_HINT}")
    if code not in DTYPE_CODES:
        raise InputError(f"{idx_path} has unknown dtype code {code} (known: "
                         f"{sorted(DTYPE_CODES)}); the index is corrupt: {_REBUILD_HINT}")
    return DTYPE_CODES[code], n_items, n_docs


def _map_index(idx_path, n_items, n_docs):
    """Map the .idx and return (sizes, pointers, doc_idx) as read-only views into it."""
    expected = _HEADER.size + n_items * (4 + 8) + n_docs * 8
    actual = os.path.getsize(idx_path)
    if actual != expected:
        problem = "is truncated" if actual < expected else "has trailing bytes"
        raise InputError(f"{idx_path} {problem}: its header promises {n_items} items and "
                         f"{n_docs} doc_idx entries ({expected} bytes) but the file has {actual} "
                         f"bytes; {_REBUILD_HINT}")
    raw = np.memmap(idx_path, dtype=np.uint8, mode="r").view(np.ndarray)
    sizes_end = _HEADER.size + 4 * n_items
    pointers_end = sizes_end + 8 * n_items
    return (raw[_HEADER.size:sizes_end].view("<i4"),
            raw[sizes_end:pointers_end].view("<i8"),
            raw[pointers_end:].view("<i8"))


def _check_items(idx_path, sizes, pointers, itemsize):
    """Items must be laid out back to back from byte 0, as every Megatron writer does."""
    position = 0
    for expected in _byte_offsets(sizes, itemsize):
        end = position + len(expected)
        negative = np.flatnonzero(sizes[position:end] < 0)
        if negative.size:
            i = position + int(negative[0])
            raise InputError(f"{idx_path}: sizes[{i}] = {sizes[i]} is negative; the index is "
                             f"corrupt: {_REBUILD_HINT}")
        wrong = np.flatnonzero(pointers[position:end] != expected)
        if wrong.size:
            i = position + int(wrong[0])
            raise InputError(f"{idx_path}: pointers[{i}] = {pointers[i]} but the items before it "
                             f"take {expected[wrong[0]]} bytes; pointers and sizes are "
                             f"inconsistent (corrupt index): {_REBUILD_HINT}")
        position = end


def _check_doc_idx(idx_path, doc_idx, n_items):
    if len(doc_idx) == 0 or doc_idx[0] != 0:
        first = doc_idx[0] if len(doc_idx) else "nothing"
        raise InputError(f"{idx_path}: doc_idx must start with 0 but starts with {first}; "
                         f"the index is corrupt: {_REBUILD_HINT}")
    for start in range(0, len(doc_idx), _CHUNK_ITEMS):
        drops = np.flatnonzero(np.diff(doc_idx[start:start + _CHUNK_ITEMS + 1]) < 0)
        if drops.size:
            i = start + int(drops[0]) + 1
            raise InputError(f"{idx_path}: doc_idx[{i}] = {doc_idx[i]} is smaller than "
                             f"doc_idx[{i - 1}] = {doc_idx[i - 1]}; document boundaries must not "
                             f"decrease (corrupt index): {_REBUILD_HINT}")
    if doc_idx[-1] > n_items:
        raise InputError(f"{idx_path}: doc_idx ends at item {doc_idx[-1]} but the index has only "
                         f"{n_items} items (corrupt index): {_REBUILD_HINT}")


def require_pair(prefix: str) -> None:
    """An InputError naming the file when dataset `prefix`'s .idx or .bin is not there."""
    for path in (index_file_path(prefix), data_file_path(prefix)):
        if not os.path.isfile(path):
            raise InputError(f"{path} not found (dataset prefix {prefix!r}): give the prefix without .bin/.idx, "
                             f"or {_REBUILD_HINT}")


class MMapIndexedDataset:
    """Read-only access to a .bin/.idx pair; items are numpy views into the mapped .bin.

    Everything is validated at open, so a damaged or mismatched pair fails here with a message
    naming the file instead of producing garbage samples hours into training."""

    def __init__(self, path_prefix):
        self.path_prefix = str(path_prefix)
        idx_path, bin_path = index_file_path(path_prefix), data_file_path(path_prefix)
        require_pair(self.path_prefix)
        self.dtype, n_items, n_docs = _read_header(idx_path)
        self.sizes, self.pointers, self.doc_idx = _map_index(idx_path, n_items, n_docs)
        _check_items(idx_path, self.sizes, self.pointers, self.dtype.itemsize)
        _check_doc_idx(idx_path, self.doc_idx, n_items)
        token_bytes = (int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize
                       if n_items else 0)
        bin_bytes = os.path.getsize(bin_path)
        if bin_bytes != token_bytes:
            problem = ("items extend beyond its end" if bin_bytes < token_bytes
                       else "it has trailing bytes no item uses")
            raise InputError(f"{bin_path} holds {bin_bytes} bytes but {idx_path} describes "
                             f"{token_bytes} bytes of tokens ({problem}); the pair is truncated or "
                             f"comes from different runs: {_REBUILD_HINT}")
        self._tokens = (np.memmap(bin_path, dtype=self.dtype, mode="r").view(np.ndarray)
                        if token_bytes else np.empty(0, dtype=self.dtype))

    @staticmethod
    def exists(prefix):
        return os.path.isfile(index_file_path(prefix)) and os.path.isfile(data_file_path(prefix))

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.get(i) for i in range(*index.indices(len(self)))]
        return self.get(index)

    def get(self, idx, offset=0, length=None):
        """Tokens [offset, offset + length) of item idx (to its end when length is None)."""
        i = operator.index(idx)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"item {idx} out of range for a dataset of {len(self)} items")
        size = int(self.sizes[i])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) lie outside item {i} of "
                             f"{size} tokens")
        start = int(self.pointers[i]) // self.dtype.itemsize + offset
        return self._tokens[start:start + length]

    def __reduce__(self):
        # Pickle (e.g. to spawned DataLoader workers) by path and re-map, never by copying tokens.
        return type(self), (self.path_prefix,)


# ----------------------------------------------------------------------------------------- writer

def _first_unfit_id(tokens, dtype):
    """Position of a token id the dataset dtype cannot hold, or None when all fit."""
    if dtype.kind == "f" or not tokens.size or np.can_cast(tokens.dtype, dtype, "safe"):
        return None
    limits = np.iinfo(dtype)
    if int(tokens.min()) < limits.min:
        return int(np.argmin(tokens))
    if int(tokens.max()) > limits.max:
        return int(np.argmax(tokens))
    return None


def _unfit_id_error(token, dtype, where):
    limits = np.iinfo(dtype)
    return InputError(f"token id {token} in {where} does not fit the dataset dtype {dtype.name} "
                      f"({limits.min}..{limits.max}): the vocabulary and the dtype do not match; "
                      f"build the dataset with best_fitting_dtype(vocab_size) (int32 for "
                      f"vocabularies of 65500 ids or more) or check the tokenizer")


def _id_array(values, name, allowed_kinds):
    array = np.asarray(values)
    if array.ndim != 1:
        raise InputError(f"{name} must be 1-D, got an array of shape {array.shape}")
    if array.size and array.dtype.kind not in allowed_kinds:
        raise InputError(f"{name} must hold integers, got dtype {array.dtype}")
    return array


def _count_array(values, name):
    counts = _id_array(values, name, "iu").astype(np.int64)
    if counts.size and counts.min() < 0:
        raise InputError(f"{name} must not be negative, got {counts.min()}")
    return counts


def _remove_stale_temporaries(final_paths):
    """Remove the temporaries of `final_paths` that a killed writer on this host left behind (its process is
    gone); a live writer's, or another host's, are left alone."""
    host = socket.gethostname()
    for path in final_paths:
        for temporary in glob.glob(f"{glob.escape(path)}.*.tmp"):
            writer = temporary[len(path) + 1:-len(".tmp")].rpartition(".")[0]
            pid, _, writer_host = writer.partition("@")
            if writer_host == host and pid.isdigit() and not _process_exists(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                    _log.info(f"removed {temporary}, left by an interrupted run")


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


class MMapIndexedDatasetBuilder:
    """Writes a dataset: tokens stream to a temporary .bin, only sizes and doc_idx stay in memory,
    and `finalize` renames the finished .bin then .idx into place.

    As a context manager, a normal exit finalizes and an exception aborts (removes temporaries).
    After an error from a write, call abort()."""

    def __init__(self, out_prefix, dtype):
        self.out_prefix = str(out_prefix)
        self.dtype = DTYPE_CODES[_dtype_code(dtype)]
        self._final_paths = (data_file_path(out_prefix), index_file_path(out_prefix))
        self._writer = self._sole_writer()
        _remove_stale_temporaries(self._final_paths)
        unique = f"{os.getpid()}@{socket.gethostname()}.{secrets.token_hex(4)}"  # who writes it: see below
        self._temp_paths = tuple(f"{path}.{unique}.tmp" for path in self._final_paths)
        # Removes the temporaries and lets go of the output if the builder is dropped without finalize() or abort().
        self._cleanup = weakref.finalize(self, _discard, self._temp_paths, self._writer)
        self._sizes = GrowingArray(np.int32)
        self._doc_idx = GrowingArray(np.int64)
        self._doc_idx.append(0)
        try:
            self._bin_file = open(self._temp_paths[0], "xb")
        except OSError as err:
            self._cleanup()  # nothing was created but the lock
            directory = os.path.dirname(os.path.abspath(self._temp_paths[0]))
            raise InputError(f"cannot write dataset {self.out_prefix!r}: output directory "
                             f"{directory} is not a writable directory ({err.strerror}); create "
                             f"it, fix its permissions, or choose another output prefix") from err

    def _sole_writer(self) -> SoleWriter:
        """This builder's claim on the prefix: a second writer of the same .bin/.idx pair is refused."""
        def refuse(holder):
            return InputError(f"dataset {self.out_prefix!r} is being written by another run ({holder}); two "
                              f"writers would publish a .bin and an .idx of different runs: wait for it to "
                              f"finish, or choose another output prefix")
        try:
            return SoleWriter(self.out_prefix + ".lock", refuse)
        except OSError as err:
            directory = os.path.dirname(os.path.abspath(self.out_prefix))
            raise InputError(f"cannot write dataset {self.out_prefix!r}: output directory {directory} is not a "
                             f"writable directory ({err.strerror}); create it, fix its permissions, or choose "
                             f"another output prefix") from err

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is not None:
            self.abort()
        elif not self._bin_file.closed:
            self.finalize()

    @contextlib.contextmanager
    def _reporting_write_errors(self):
        try:
            yield
        except OSError as err:
            raise InputError(f"writing dataset {self.out_prefix!r} failed ({err}); free disk "
                             f"space or choose another output prefix") from err

    def _require_open(self):
        if self._bin_file.closed:
            raise RuntimeError(f"the builder of {self.out_prefix!r} was already finalized or "
                               f"aborted")

    def _write_tokens(self, tokens):
        with self._reporting_write_errors():
            self._bin_file.write(_as_bytes(tokens, self.dtype))

    def _token_array(self, tokens):
        return _id_array(tokens, "tokens", "iuf" if self.dtype.kind == "f" else "iu")

    def add_item(self, tokens):
        """Append one item (a sentence, or a whole document without sentence splitting)."""
        self._require_open()
        tokens = self._token_array(tokens)
        if tokens.size > _MAX_ITEM_TOKENS:
            raise InputError(f"an item of {tokens.size} tokens exceeds the format's limit of "
                             f"{_MAX_ITEM_TOKENS}; split the document into smaller items")
        bad = _first_unfit_id(tokens, self.dtype)
        if bad is not None:
            where = f"item {self._sizes.size} (document {self._doc_idx.size - 1}), position {bad}"
            raise _unfit_id_error(tokens[bad], self.dtype, where)
        self._write_tokens(tokens)
        self._sizes.append(tokens.size)

    def end_document(self):
        """Close the current document; an empty document still counts as one."""
        self._require_open()
        self._doc_idx.append(self._sizes.size)

    def add_documents(self, tokens, item_sizes, items_per_document):
        """Append many documents at once: `tokens` holds every item back to back, `item_sizes`
        each item's length, `items_per_document` each document's item count (0 = empty document).
        Equivalent to add_item/end_document in a loop, but without a Python loop per item."""
        self._require_open()
        tokens = self._token_array(tokens)
        item_sizes = _count_array(item_sizes, "item_sizes")
        items_per_document = _count_array(items_per_document, "items_per_document")
        if int(item_sizes.sum()) != tokens.size:
            raise InputError(f"item_sizes add up to {int(item_sizes.sum())} tokens but "
                             f"{tokens.size} tokens were given")
        if int(items_per_document.sum()) != item_sizes.size:
            raise InputError(f"items_per_document adds up to {int(items_per_document.sum())} "
                             f"items but {item_sizes.size} item sizes were given")
        if item_sizes.size and item_sizes.max() > _MAX_ITEM_TOKENS:
            raise InputError(f"an item of {item_sizes.max()} tokens exceeds the format's limit of "
                             f"{_MAX_ITEM_TOKENS}; split the document into smaller items")
        bad = _first_unfit_id(tokens, self.dtype)
        if bad is not None:
            item = int(np.searchsorted(np.cumsum(item_sizes), bad, side="right"))
            document = int(np.searchsorted(np.cumsum(items_per_document), item, side="right"))
            where = (f"item {self._sizes.size + item} (document "
                     f"{self._doc_idx.size - 1 + document})")
            raise _unfit_id_error(tokens[bad], self.dtype, where)
        self._write_tokens(tokens)
        self._doc_idx.extend(self._sizes.size + np.cumsum(items_per_document))
        self._sizes.extend(item_sizes)

    def merge_file(self, prefix):
        """Append every item and document of the dataset at `prefix`."""
        self._require_open()
        other = MMapIndexedDataset(prefix)
        if other.dtype != self.dtype:
            raise InputError(f"cannot merge {prefix} (dtype {other.dtype.name}) into "
                             f"{self.out_prefix} (dtype {self.dtype.name}): all inputs must have "
                             f"the same dtype; re-create {prefix} with the same vocabulary")
        with open(data_file_path(prefix), "rb") as source, self._reporting_write_errors():
            shutil.copyfileobj(source, self._bin_file, _COPY_BYTES)
        self._doc_idx.extend(other.doc_idx[1:] + self._sizes.size)
        self._sizes.extend(other.sizes)

    def finalize(self):
        """Write the .idx and move both files into place (.bin first, so a visible .idx always
        has its .bin); on any failure the temporaries are removed."""
        self._require_open()
        try:
            with self._reporting_write_errors():
                self._bin_file.close()
                self._write_index(self._temp_paths[1])
                for temp, final in zip(self._temp_paths, self._final_paths):
                    os.replace(temp, final)
        except BaseException:
            self.abort()
            raise
        self._cleanup.detach()
        self._writer.release()

    def _write_index(self, path):
        sizes, doc_idx = self._sizes.values, self._doc_idx.values
        with open(path, "xb") as index:
            index.write(_HEADER.pack(_MAGIC, _VERSION, _dtype_code(self.dtype),
                                     sizes.size, doc_idx.size))
            index.write(_as_bytes(sizes, "<i4"))
            for offsets in _byte_offsets(sizes, self.dtype.itemsize):
                index.write(_as_bytes(offsets, "<i8"))
            index.write(_as_bytes(doc_idx, "<i8"))

    def abort(self):
        """Discard everything written so far; safe to call more than once."""
        with contextlib.suppress(OSError):
            self._bin_file.close()
        self._cleanup()


# ---------------------------------------------------------------------------------------- merging

def dataset_prefixes_in(directory):
    """Every .bin/.idx pair in `directory`, ordered like Megatron-LM's merge tool: by first
    appearance in the sorted file names."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as err:
        raise InputError(f"cannot list directory {directory} ({err.strerror})") from err
    stems = dict.fromkeys(os.path.splitext(name)[0] for name in names
                          if name.endswith((".bin", ".idx")))
    prefixes = [os.path.join(directory, stem) for stem in stems]
    for prefix in prefixes:
        for path, partner in ((index_file_path(prefix), data_file_path(prefix)),
                              (data_file_path(prefix), index_file_path(prefix))):
            if os.path.exists(path) and not os.path.isfile(partner):
                raise InputError(f"{path} has no matching {partner}: restore the missing file "
                                 f"or move {path} out of {directory}")
    if not prefixes:
        raise InputError(f"{directory} contains no .bin/.idx dataset pairs")
    return prefixes


def merge_datasets(input_prefixes, output_prefix):
    """Concatenate datasets in the given order into one; document boundaries are kept."""
    prefixes = [str(prefix) for prefix in input_prefixes]
    if not prefixes:
        raise InputError("merging needs at least one input dataset prefix")
    dtype = MMapIndexedDataset(prefixes[0]).dtype
    with MMapIndexedDatasetBuilder(output_prefix, dtype) as builder:
        for prefix in prefixes:
            builder.merge_file(prefix)
