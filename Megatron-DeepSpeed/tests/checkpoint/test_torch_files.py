"""checkpoint/saving.own_storages: a tensor is written from its own storage without a copy only where torch.save
then writes the bytes it writes for a copy; load_file refuses pickled code as untrusted code."""
import io
import pickle

import pytest
import torch
from tests.checkpoint.test_trust import Planted

from megatron.checkpoint.torch_files import load_file, own_storages
from megatron.errors import InputError


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
