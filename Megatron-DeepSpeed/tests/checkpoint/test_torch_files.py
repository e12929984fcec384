"""checkpoint/saving.own_storages: a tensor is written from its own storage without a copy only where torch.save
then writes the bytes it writes for a copy."""
import io

import torch

from megatron.checkpoint.torch_files import own_storages


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
