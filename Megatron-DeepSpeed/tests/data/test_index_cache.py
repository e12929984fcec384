"""The .npy index cache: md5 naming, reuse without rebuilding, atomic writes, one builder rank."""
import hashlib
import os

import numpy as np
import pytest

from tests.helpers.distributed import run_on_ranks
from megatron.data.index_building import SampleIndex
from megatron.data.index_cache import (IndexCache, cache_directory, index_description,
                                       load_or_build)
from megatron.errors import InputError

INDEX = SampleIndex(np.array([2, 0, 1], dtype=np.int32),
                    np.array([[0, 0], [1, 2]], dtype=np.int32),
                    np.array([0], dtype=np.uint32))


class CountingBuild:
    def __init__(self, index=INDEX):
        self.index = index
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.index


def description(**changes):
    params = dict(data_prefix="/data/corpus_text_document", split_name="train", num_samples=100,
                  seq_length=1024, seed=1234, splits_string="949,50,1")
    params.update(changes)
    return index_description(**params)


def test_description_is_megatron_deepspeeds_text():
    assert description() == ("GPT Dataset\n\nData prefix /data/corpus_text_document\n"
                             "Dataset name train\nNumber of samples 100\nSequence length 1024\n"
                             "Random seed 1234\nSplit 949,50,1\n")


def test_cache_directory_is_beside_the_data_unless_given():
    assert cache_directory("/data/corpus_text_document", None) == "/data/index-cache"
    assert cache_directory("/data/corpus_text_document", "/scratch/c") == "/scratch/c"


def test_files_are_named_by_the_md5_of_the_description(tmp_path):
    cache = IndexCache(str(tmp_path), description())
    build = CountingBuild()
    load_or_build(cache, build)
    key = hashlib.md5(description().encode("utf-8")).hexdigest()
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"{key}.dsc", f"{key}_doc_idx.npy", f"{key}_sample_idx.npy", f"{key}_shuffle_idx.npy"])
    assert (tmp_path / f"{key}.dsc").read_text() == description()


def test_cache_hit_returns_identical_arrays_without_rebuilding(tmp_path):
    build = CountingBuild()
    first = load_or_build(IndexCache(str(tmp_path), description()), build)
    mtimes = {name: os.stat(tmp_path / name).st_mtime_ns for name in os.listdir(tmp_path)}
    second = load_or_build(IndexCache(str(tmp_path), description()), build)
    assert build.calls == 1
    assert {name: os.stat(tmp_path / name).st_mtime_ns for name in os.listdir(tmp_path)} == mtimes
    for built, loaded, cached in zip(INDEX, first, second):
        assert isinstance(cached, np.memmap) and cached.dtype == built.dtype
        np.testing.assert_array_equal(loaded, built)
        np.testing.assert_array_equal(cached, built)


def test_every_parameter_changes_the_file_names(tmp_path):
    variants = [description(), description(data_prefix="/data/other"),
                description(split_name="valid"), description(num_samples=101),
                description(seq_length=2048), description(seed=1),
                description(splits_string="98,1,1")]
    keys = {os.path.basename(IndexCache(str(tmp_path), text).description_path)
            for text in variants}
    assert len(keys) == len(variants)


def test_an_incomplete_cache_is_rebuilt(tmp_path):
    cache = IndexCache(str(tmp_path), description())
    build = CountingBuild()
    load_or_build(cache, build)
    os.remove(cache.description_path)   # as if the run died before the last rename
    load_or_build(cache, build)
    assert build.calls == 2


def test_unwritable_cache_directory_asks_for_data_cache_path(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cache = IndexCache(str(blocker / "index-cache"), description())
    with pytest.raises(InputError, match="cannot write the GPT index cache .*--data-cache-path"):
        load_or_build(cache, CountingBuild())


def test_failed_save_leaves_no_file_behind(tmp_path):
    unsaveable = SampleIndex(INDEX.doc_idx, INDEX.sample_idx, np.array([object()]))
    with pytest.raises(ValueError):
        load_or_build(IndexCache(str(tmp_path), description()), CountingBuild(unsaveable))
    leftovers = [name for name in os.listdir(tmp_path) if not name.endswith(
        ("_doc_idx.npy", "_sample_idx.npy"))]
    assert leftovers == []   # no temporary, no shuffle_idx, no .dsc: the cache is not complete
    assert not IndexCache(str(tmp_path), description()).is_complete()


def test_unreadable_cache_file_says_to_delete_it(tmp_path):
    cache = IndexCache(str(tmp_path), description())
    load_or_build(cache, CountingBuild())
    with open(cache.array_paths[1], "wb") as stream:
        stream.write(b"not numpy")
    with pytest.raises(InputError, match="delete it"):
        load_or_build(cache, CountingBuild())


# ---------------------------------------------------------------------------------- two ranks

def _load_twice_on_a_rank(directory, blocker):
    """Load a normal cache, then one whose directory cannot be created; report both."""
    build = CountingBuild()
    index = load_or_build(IndexCache(directory, description()), build)
    outcome = {"builds": build.calls, "doc_idx": np.asarray(index.doc_idx).tolist()}
    try:
        load_or_build(IndexCache(os.path.join(blocker, "index-cache"), description()),
                      CountingBuild())
    except InputError as err:
        outcome["error"] = str(err)
    return outcome


def test_rank_zero_builds_and_the_other_rank_loads(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")   # a file where rank 0 would have to create a directory
    rank0, rank1 = run_on_ranks(_load_twice_on_a_rank, 2, str(tmp_path / "cache"), str(blocker))
    assert rank0["builds"] == 1 and rank1["builds"] == 0
    assert rank0["doc_idx"] == rank1["doc_idx"] == INDEX.doc_idx.tolist()
    assert "cannot write the GPT index cache" in rank0["error"]    # rank 0's own error
    assert "global rank 0 did not leave" in rank1["error"]         # rank 1 does not hang
