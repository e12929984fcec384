"""checkpoint/tensor_records: tensors read from their records in a torch file equal what torch.load reads (of
zip-format files; legacy ones are loaded whole), and a file cut inside a tensor is named in one line."""
import pytest
import torch

from megatron.checkpoint.tensor_records import FileSections, TensorRecords
from megatron.errors import InputError


def test_each_tensor_reads_as_torch_load_reads_it(tmp_path):
    base = torch.arange(24.0).reshape(4, 6)
    contents = {"whole": base, "rows": base[1:3], "columns": base[:, 2:4], "bf16": torch.randn(3, 5).bfloat16(),
                "scalar": torch.tensor(7, dtype=torch.int64), "empty": torch.zeros(0, 4),
                "flags": torch.tensor([True, False]),
                "nested": {"inner": torch.arange(5, dtype=torch.int32)}}
    path = str(tmp_path / "file.pt")
    torch.save(contents, path)
    records, loaded = TensorRecords(path), torch.load(path)
    keys = ("whole", "rows", "columns", "bf16", "scalar", "empty", "flags")
    read = records.read({key: records.contents[key] for key in keys})
    assert list(read) == list(keys)
    for key in keys:
        assert read[key].device.type == "cpu" and read[key].dtype == loaded[key].dtype, key
        assert read[key].stride() == loaded[key].stride() and torch.equal(read[key], loaded[key]), key
    # views of one storage share it, as torch.load's
    assert read["rows"].untyped_storage().data_ptr() == read["whole"].untyped_storage().data_ptr()
    inner = records.read({"inner": records.contents["nested"]["inner"]})["inner"]
    assert torch.equal(inner, loaded["nested"]["inner"])


def test_sections_take_tensors_by_name_from_zip_and_legacy_files(tmp_path):
    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5)}
    paths = {}
    for key, legacy in (("zip", False), ("legacy", True)):
        paths[key] = str(tmp_path / f"{key}.pt")
        torch.save({"model": tensors, "other": 1}, paths[key], _use_new_zipfile_serialization=not legacy)
    for key in paths:
        sections = FileSections({key: paths[key]}, lambda contents: contents["model"])
        assert sections.names(key) == ["a", "b"]
        taken = sections.take(key, ["b"])
        assert list(taken) == ["b"] and torch.equal(taken["b"], tensors["b"])


def test_a_file_cut_inside_a_tensor_is_named(tmp_path):
    path = str(tmp_path / "file.pt")
    torch.save({"w": torch.randn(1000)}, path)
    records = TensorRecords(path)
    meta = records.contents["w"]
    with open(path, "r+b") as handle:  # keep the archive's directory readable: cut the data only
        handle.truncate(meta.untyped_storage()._checkpoint_offset + 100)
    with pytest.raises(InputError, match="file.pt ends inside a tensor's data"):
        records.read({"w": meta})
