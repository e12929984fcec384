"""checkpoint/torch_files: a tensor is written from its own storage without a copy only where torch.save then
writes the bytes it writes for a copy; the library's one torch.load and its torch.save calls are there; load_file
refuses pickled code as untrusted code."""
import ast
import io
import os
import pickle

import pytest
import torch
from tests.checkpoint.test_trust import Planted

from megatron.checkpoint.torch_files import load_file, own_storages
from megatron.errors import InputError
from tests.helpers.paths import PACKAGE_ROOT


def saved(tensors: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def test_only_tensors_filling_a_storage_of_their_own_are_kept():
    whole = torch.arange(12.0).reshape(3, 4)
    tensors = {"whole": whole, "rows": torch.arange(8.0).reshape(4, 2)[1:3], "columns": whole.narrow(1, 1, 2),
               "again": whole, "transposed": torch.arange(6.0).reshape(2, 3).t(),
               "size-one-dim": torch.arange(4.0).as_strided((1, 4), (7, 1)), "empty": torch.zeros(0),
               "other-empty": torch.zeros(0, 3)}
    owned = own_storages(tensors)
    assert [key for key in tensors if owned[key] is tensors[key]] == ["whole", "empty"]
    assert all(torch.equal(owned[key], tensors[key]) for key in tensors)
    assert saved(owned) == saved({key: tensor.clone() for key, tensor in tensors.items()})


def torch_calls(name: str) -> list:
    """(file, line) of every call of torch.<name> or trust.<name> in the library's source."""
    found = []
    for directory, _, files in os.walk(os.path.join(PACKAGE_ROOT, "megatron")):
        for file in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(directory, file)
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            found += [(os.path.relpath(path, PACKAGE_ROOT), node.lineno) for node in ast.walk(tree)
                      if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr == name and isinstance(node.func.value, ast.Name)
                      and node.func.value.id in ("torch", "trust")]
    return found


def test_the_library_has_one_torch_load_and_its_torch_saves_in_one_module():
    """docs/ARCHITECTURE.md: every checkpoint file is read through torch_files.load_file (trust.torch_load, the
    one torch.load, under the allow-list) and written by torch_files."""
    assert [file for file, _ in torch_calls("load")] == ["megatron/checkpoint/trust.py"]
    assert [file for file, _ in torch_calls("torch_load")] == ["megatron/checkpoint/torch_files.py"]
    assert {file for file, _ in torch_calls("save")} == {"megatron/checkpoint/torch_files.py"}


def test_replace_writes_through_a_temporary_and_keeps_the_old_file_when_it_fails(tmp_path):
    from megatron.checkpoint.torch_files import replace, save

    path = str(tmp_path / "mp_rank_00_model_states.pt")
    save(path, {"optimizer": {"step": 3}, "module": {"w": torch.ones(2)}})
    replace(path, {"optimizer": None, "module": {"w": torch.zeros(2)}})
    contents = load_file(path)
    assert contents["optimizer"] is None and torch.equal(contents["module"]["w"], torch.zeros(2))
    with pytest.raises(TypeError, match="cannot pickle 'generator' object"):
        replace(path, {"unpicklable": (step for step in range(2))})
    assert torch.equal(load_file(path)["module"]["w"], torch.zeros(2))
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # no temporary left


def test_a_raw_pickle_of_code_is_refused_as_untrusted_code_without_a_flag_that_cannot_admit_it(tmp_path):
    """A plain pickle (not torch's format) names no type torch's refusal reports: no "--trust-checkpoint <type>"
    to pass, and never "damaged"."""
    path = tmp_path / "model_states.pt"
    path.write_bytes(pickle.dumps({"weights": Planted(str(tmp_path / "MARKER"))}))  # protocol 5
    with pytest.raises(InputError) as refused:
        load_file(str(path))
    assert str(refused.value) == (f"checkpoint file {path} holds pickled code, not plain data: it is refused as "
                                  "untrusted code (loading it could run that code); save the weights as tensors and "
                                  "plain values")
    assert not (tmp_path / "MARKER").exists()
