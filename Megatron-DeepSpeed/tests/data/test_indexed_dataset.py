"""The mmap indexed dataset: exact bytes on disk, zero-copy reading, merging, and failure modes."""
import gc
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from megatron.data.indexed_dataset import (
    DTYPE_CODES, MMapIndexedDataset, MMapIndexedDatasetBuilder, best_fitting_dtype,
    data_file_path, dataset_prefixes_in, index_file_path, merge_datasets)
from megatron.errors import InputError
from tests.helpers.paths import PACKAGE_ROOT

MAGIC = b"MMIDIDX\x00\x00"
MERGE_TOOL = os.path.join(PACKAGE_ROOT,
                          "tools", "merge_datasets.py")

# Document 0 has two items, document 1 is empty, document 2 has one item.
DOCUMENTS = [[[1, 2, 3], [4]], [], [[5, 6]]]


def index_bytes(code, sizes, pointers, doc_idx, version=1, magic=MAGIC):
    """The .idx layout written out field by field."""
    return (magic + struct.pack("<Q", version) + struct.pack("<B", code)
            + struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx))
            + struct.pack(f"<{len(sizes)}i", *sizes) + struct.pack(f"<{len(pointers)}q", *pointers)
            + struct.pack(f"<{len(doc_idx)}q", *doc_idx))


def write_documents(prefix, documents, dtype):
    with MMapIndexedDatasetBuilder(prefix, dtype) as builder:
        for document in documents:
            for item in document:
                builder.add_item(item)
            builder.end_document()
    return prefix


def read_pair(prefix):
    with open(data_file_path(prefix), "rb") as data, open(index_file_path(prefix), "rb") as index:
        return data.read(), index.read()


def random_documents(rng, count, vocab):
    return [[rng.integers(0, vocab, rng.integers(0, 6)).tolist() for _ in range(rng.integers(0, 4))]
            for _ in range(count)]


@pytest.mark.parametrize("dtype, code, bin_format, pointers", [
    (np.uint16, 8, "<6H", [0, 6, 8]),
    (np.int32, 4, "<6i", [0, 12, 16]),
])
def test_files_match_hand_computed_bytes(tmp_path, dtype, code, bin_format, pointers):
    data, index = read_pair(write_documents(str(tmp_path / "ds"), DOCUMENTS, dtype))
    assert data == struct.pack(bin_format, 1, 2, 3, 4, 5, 6)
    assert index == index_bytes(code, sizes=[3, 1, 2], pointers=pointers, doc_idx=[0, 2, 2, 3])
    assert sorted(os.listdir(tmp_path)) == ["ds.bin", "ds.idx"]


def test_reader_round_trip(tmp_path):
    ds = MMapIndexedDataset(write_documents(str(tmp_path / "ds"), DOCUMENTS, np.uint16))
    assert len(ds) == 3 and ds.dtype == np.uint16
    assert ds.sizes.tolist() == [3, 1, 2] and ds.sizes.dtype == np.int32
    assert ds.pointers.tolist() == [0, 6, 8]
    assert ds.doc_idx.tolist() == [0, 2, 2, 3] and ds.doc_idx.dtype == np.int64
    assert [item.tolist() for item in ds] == [[1, 2, 3], [4], [5, 6]]
    assert ds[-1].tolist() == [5, 6] and ds[np.int64(1)].tolist() == [4]
    assert [item.tolist() for item in ds[0:3:2]] == [[1, 2, 3], [5, 6]]
    assert ds.get(0, offset=1).tolist() == [2, 3]
    assert ds.get(0, offset=1, length=1).tolist() == [2]
    assert ds.get(2, length=0).tolist() == []
    with pytest.raises(IndexError):
        ds.get(0, offset=2, length=2)
    with pytest.raises(IndexError):
        ds[3]
    assert MMapIndexedDataset.exists(str(tmp_path / "ds"))
    assert not MMapIndexedDataset.exists(str(tmp_path / "other"))


def test_items_are_views_into_the_mapped_bin(tmp_path):
    ds = MMapIndexedDataset(write_documents(str(tmp_path / "ds"), DOCUMENTS, np.int32))
    item = ds.get(0, offset=1)
    base = item
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap) and base.filename == str(tmp_path / "ds.bin")
    assert np.shares_memory(item, base) and not item.flags.writeable


def test_empty_dataset_round_trips(tmp_path):
    prefix = write_documents(str(tmp_path / "ds"), [[], []], np.uint16)
    assert read_pair(prefix) == (b"", index_bytes(8, [], [], [0, 0, 0]))
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == 0 and ds.doc_idx.tolist() == [0, 0, 0]


def test_pickles_by_path_not_by_content(tmp_path):
    prefix = write_documents(str(tmp_path / "ds"), [[list(range(5000))]], np.int32)
    payload = pickle.dumps(MMapIndexedDataset(prefix))
    assert len(payload) < 1000
    assert pickle.loads(payload)[0].tolist() == list(range(5000))


def test_add_documents_equals_item_by_item(tmp_path):
    documents = random_documents(np.random.default_rng(0), 200, vocab=60000)
    write_documents(str(tmp_path / "loop"), documents, np.uint16)
    items = [item for document in documents for item in document]
    with MMapIndexedDatasetBuilder(str(tmp_path / "bulk"), np.uint16) as builder:
        half = 100  # two calls, to check that the second continues the first's numbering
        for part in (documents[:half], documents[half:]):
            part_items = [item for document in part for item in document]
            builder.add_documents(np.array(sum(part_items, []), dtype=np.int64),
                                  [len(item) for item in part_items],
                                  [len(document) for document in part])
    assert len(items) > 100 and any(not document for document in documents)
    assert read_pair(str(tmp_path / "bulk")) == read_pair(str(tmp_path / "loop"))


def test_add_documents_rejects_inconsistent_counts(tmp_path):
    with MMapIndexedDatasetBuilder(str(tmp_path / "ds"), np.uint16) as builder:
        with pytest.raises(InputError, match="item_sizes add up to 4 tokens but 3"):
            builder.add_documents([1, 2, 3], [2, 2], [2])
        with pytest.raises(InputError, match="items_per_document adds up to 1 items but 2"):
            builder.add_documents([1, 2, 3], [2, 1], [1])
        with pytest.raises(InputError, match="must not be negative"):
            builder.add_documents([1, 2, 3], [4, -1], [2])


def test_merge_equals_writing_everything_at_once(tmp_path):
    documents = random_documents(np.random.default_rng(1), 60, vocab=1000)
    parts = [documents[:25], documents[25:26], documents[26:]]
    for number, part in enumerate(parts):
        write_documents(str(tmp_path / f"part{number}"), part, np.uint16)
    write_documents(str(tmp_path / "whole"), documents, np.uint16)
    merge_datasets([str(tmp_path / f"part{number}") for number in range(len(parts))],
                   str(tmp_path / "merged"))
    assert read_pair(str(tmp_path / "merged")) == read_pair(str(tmp_path / "whole"))


def test_merge_tool_takes_a_directory_in_sorted_order_from_any_cwd(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "README").write_text("not a dataset")
    # "b-1.bin" sorts before "b.bin", so the tool (like Megatron-LM's) merges b-1 before b.
    write_documents(str(tmp_path / "in" / "b"), [[[3]]], np.int32)
    write_documents(str(tmp_path / "in" / "b-1"), [[[2]]], np.int32)
    write_documents(str(tmp_path / "in" / "a"), [[[1]], []], np.int32)
    write_documents(str(tmp_path / "extra"), [[[4, 5]]], np.int32)
    result = subprocess.run(
        [sys.executable, MERGE_TOOL, "--input", "in", str(tmp_path / "extra"),
         "--output-prefix", "out"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    merged = MMapIndexedDataset(str(tmp_path / "out"))
    assert [item.tolist() for item in merged] == [[1], [2], [3], [4, 5]]
    assert merged.doc_idx.tolist() == [0, 1, 1, 2, 3, 4]
    assert "4 items, 5 documents" in result.stdout


def test_merge_tool_reports_bad_input_without_traceback(tmp_path):
    (tmp_path / "in").mkdir()
    write_documents(str(tmp_path / "in" / "a"), [[[1]]], np.int32)
    os.remove(tmp_path / "in" / "a.bin")
    with pytest.raises(InputError, match=r"a\.idx has no matching .*a\.bin"):
        dataset_prefixes_in(str(tmp_path / "in"))
    result = subprocess.run(
        [sys.executable, MERGE_TOOL, "--input", str(tmp_path / "nothing"), "--output-prefix",
         str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--input" in result.stderr
    assert "neither a directory nor a dataset prefix" in result.stderr
    assert not os.path.exists(tmp_path / "out.bin")


def test_merge_rejects_mixed_dtypes_and_leaves_nothing(tmp_path):
    write_documents(str(tmp_path / "small"), [[[1]]], np.uint16)
    write_documents(str(tmp_path / "large"), [[[70000]]], np.int32)
    with pytest.raises(InputError, match=r"large \(dtype int32\) into .* \(dtype uint16\)"):
        merge_datasets([str(tmp_path / "small"), str(tmp_path / "large")], str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["large.bin", "large.idx", "small.bin", "small.idx"]


def corrupt(tmp_path, index=None, data=None):
    """A valid uint16 dataset (DOCUMENTS) whose .idx and/or .bin are then replaced."""
    prefix = write_documents(str(tmp_path / "ds"), DOCUMENTS, np.uint16)
    for path, content in ((index_file_path(prefix), index), (data_file_path(prefix), data)):
        if content is not None:
            with open(path, "wb") as stream:
                stream.write(content)
    return prefix


GOOD_INDEX = index_bytes(8, [3, 1, 2], [0, 6, 8], [0, 2, 2, 3])


DAMAGED = {
    "png-file": (b"\x89PNG\r\n\x1a\n" + bytes(56), None, "idx", "is not a Megatron 'mmap' index"),
    "lazy-format": (b"TNTIDX\x00\x00" + bytes(40), None, "idx", "'lazy'/'cached' index"),
    "version-2": (index_bytes(8, [3, 1, 2], [0, 6, 8], [0, 2, 2, 3], version=2), None, "idx",
                  "version 2"),
    "dtype-code-9": (index_bytes(9, [3, 1, 2], [0, 6, 8], [0, 2, 2, 3]), None, "idx",
                     "unknown dtype code 9"),
    "truncated-header": (GOOD_INDEX[:20], None, "idx", "truncated: 20 bytes"),
    "truncated-arrays": (GOOD_INDEX[:-8], None, "idx", "is truncated: its header promises 3 items"),
    "trailing-index-bytes": (GOOD_INDEX + b"\x00", None, "idx", "has trailing bytes"),
    "pointer-gap": (index_bytes(8, [3, 1, 2], [0, 6, 10], [0, 2, 2, 3]), None, "idx",
                    r"pointers\[2\] = 10 but the items before it take 8 bytes"),
    "negative-size": (index_bytes(8, [3, -1, 2], [0, 6, 4], [0, 2, 2, 3]), None, "idx",
                      r"sizes\[1\] = -1"),
    "doc-idx-decreasing": (index_bytes(8, [3, 1, 2], [0, 6, 8], [0, 2, 1, 3]), None, "idx",
                           r"doc_idx\[2\] = 1 is smaller than doc_idx\[1\] = 2"),
    "doc-idx-beyond-items": (index_bytes(8, [3, 1, 2], [0, 6, 8], [0, 2, 4]), None, "idx",
                             "ends at item 4 .* only 3"),
    "doc-idx-not-from-0": (index_bytes(8, [3, 1, 2], [0, 6, 8], [1, 2, 3]), None, "idx",
                           "must start with 0"),
    "items-beyond-bin": (None, struct.pack("<5H", 1, 2, 3, 4, 5), "bin",
                         "items extend beyond its end"),
    "trailing-bin-bytes": (None, struct.pack("<7H", 1, 2, 3, 4, 5, 6, 7), "bin",
                           "trailing bytes no item uses"),
}


@pytest.mark.parametrize("index, data, file, message", DAMAGED.values(), ids=DAMAGED.keys())
def test_reader_rejects_damaged_files_naming_them(tmp_path, index, data, file, message):
    prefix = corrupt(tmp_path, index, data)
    with pytest.raises(InputError, match=message) as error:
        MMapIndexedDataset(prefix)
    assert f"{prefix}.{file}" in str(error.value)
    assert "preprocess_data.py" in str(error.value)


@pytest.mark.parametrize("missing", ["idx", "bin"])
def test_reader_names_the_missing_file(tmp_path, missing):
    prefix = corrupt(tmp_path)
    os.remove(f"{prefix}.{missing}")
    with pytest.raises(InputError, match=rf"{prefix}\.{missing} not found"):
        MMapIndexedDataset(prefix)


def test_nothing_appears_before_finalize_and_no_temporaries_after(tmp_path):
    builder = MMapIndexedDatasetBuilder(str(tmp_path / "ds"), np.uint16)
    builder.add_item([1, 2])
    builder.end_document()
    assert not MMapIndexedDataset.exists(str(tmp_path / "ds"))
    assert [name for name in os.listdir(tmp_path) if not name.endswith(".tmp")] == ["ds.lock"]  # the writer's claim
    builder.finalize()
    assert sorted(os.listdir(tmp_path)) == ["ds.bin", "ds.idx"]
    with pytest.raises(RuntimeError, match="already finalized"):
        builder.add_item([3])


def test_abort_exception_and_abandonment_leave_nothing(tmp_path):
    builder = MMapIndexedDatasetBuilder(str(tmp_path / "aborted"), np.uint16)
    builder.add_item([1, 2])
    builder.abort()
    builder.abort()
    with pytest.raises(KeyError):
        with MMapIndexedDatasetBuilder(str(tmp_path / "failed"), np.uint16) as failing:
            failing.add_item([1, 2])
            raise KeyError("simulated failure")
    abandoned = MMapIndexedDatasetBuilder(str(tmp_path / "abandoned"), np.uint16)
    abandoned.add_item([1])
    del abandoned
    gc.collect()
    assert os.listdir(tmp_path) == []


def test_failed_finalize_removes_temporaries(tmp_path):
    (tmp_path / "ds.bin").mkdir()  # the final name is taken by a directory
    builder = MMapIndexedDatasetBuilder(str(tmp_path / "ds"), np.uint16)
    builder.add_item([1, 2])
    with pytest.raises(InputError, match=r"writing dataset .*ds' failed"):
        builder.finalize()
    assert os.listdir(tmp_path) == ["ds.bin"] and os.listdir(tmp_path / "ds.bin") == []


@pytest.mark.parametrize("bad_id", [65536, -1])
def test_out_of_range_id_names_it_and_suggests_a_wider_dtype(tmp_path, bad_id):
    with MMapIndexedDatasetBuilder(str(tmp_path / "ds"), np.uint16) as builder:
        builder.add_item([1])
        builder.end_document()
        with pytest.raises(InputError, match=rf"token id {bad_id} in item 1 \(document 1\), "
                                             r"position 1 .*uint16 .*int32"):
            builder.add_item([7, bad_id, 8])
        # Documents 1..4 of this call hold items 1, -, 2, 3: the bad id is in item 3, document 4.
        with pytest.raises(InputError, match=rf"token id {bad_id} in item 3 \(document 4\)"):
            builder.add_documents([5, 6, bad_id], [1, 1, 1], [1, 0, 1, 1])
        builder.add_item([2])  # the rejected calls wrote nothing
    assert [item.tolist() for item in MMapIndexedDataset(str(tmp_path / "ds"))] == [[1], [2]]


def test_non_integer_tokens_are_rejected(tmp_path):
    with MMapIndexedDatasetBuilder(str(tmp_path / "ds"), np.int32) as builder:
        with pytest.raises(InputError, match="must hold integers, got dtype float64"):
            builder.add_item([1.5, 2.0])
        with pytest.raises(InputError, match="must be 1-D"):
            builder.add_item([[1, 2]])


def test_unwritable_output_directory_is_named(tmp_path):
    regular_file = tmp_path / "a_file"
    regular_file.write_text("")
    with pytest.raises(InputError, match=rf"output directory {regular_file} is not a writable"):
        MMapIndexedDatasetBuilder(str(regular_file / "ds"), np.uint16)


def test_unsupported_builder_dtype(tmp_path):
    with pytest.raises(InputError, match="dtype uint32 cannot be stored"):
        MMapIndexedDatasetBuilder(str(tmp_path / "ds"), np.uint32)
    assert os.listdir(tmp_path) == []


def test_dtype_helpers():
    assert best_fitting_dtype(65499) == np.uint16
    assert best_fitting_dtype(65500) == np.int32
    assert best_fitting_dtype(50257) == DTYPE_CODES[8]
    assert [DTYPE_CODES[code] for code in (1, 2, 3, 5, 6, 7)] == [
        np.uint8, np.int8, np.int16, np.int64, np.float64, np.float32]
    assert index_file_path("a/b") == "a/b.idx" and data_file_path("a/b") == "a/b.bin"
