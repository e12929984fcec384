"""megatron/model/cross_entropy.py against torch's fp32 cross entropy: same losses and gradients in every dtype and
chunking, no fp32 copy of the logits kept for backward. (Vocab-split across ranks: test_tensor_parallel.py.)"""
import pytest
import torch
import torch.nn.functional as F

from megatron.model.cross_entropy import EAGER_CHUNK_KERNELS, compiled_chunk_kernels, cross_entropy
from megatron.model.kernels import select_kernels

VOCAB = 101


def reference(logits, labels, upstream):
    """torch's cross entropy on the logits upcast to fp32: losses, and the gradient rounded to the logits' dtype."""
    upcast = logits.detach().float().requires_grad_(True)
    losses = F.cross_entropy(upcast.flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape)
    (losses * upstream).sum().backward()
    return losses.detach(), upcast.grad.to(logits.dtype)


def inputs(dtype, scale=3.0, offset=0.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 37, VOCAB, generator=generator) * scale + offset).to(dtype)
    labels = torch.randint(0, VOCAB, (3, 37), generator=generator)
    upstream = torch.randn(3, 37, generator=generator)
    return logits.requires_grad_(True), labels, upstream


@pytest.mark.low_precision
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows_per_chunk", [1, 5, 111, 1000])  # 111 rows in all: one-row, uneven, whole chunks
def test_matches_torch_in_fp32_whatever_the_dtype_and_chunking(dtype, rows_per_chunk):
    logits, labels, upstream = inputs(dtype)
    losses = cross_entropy(logits, labels, chunk_bytes=4 * VOCAB * rows_per_chunk)
    (losses * upstream).sum().backward()
    expected_losses, expected_grad = reference(logits, labels, upstream)
    assert losses.dtype == torch.float32 and logits.grad.dtype == dtype
    torch.testing.assert_close(losses, expected_losses, rtol=1e-6, atol=2e-6)
    # The gradient is computed in fp32 and rounded once: at most one rounding step from torch's, in any dtype.
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]
    torch.testing.assert_close(logits.grad, expected_grad, rtol=tolerance, atol=tolerance * 1e-2)


@pytest.mark.low_precision
def test_large_logits_do_not_overflow_and_confident_labels_keep_their_gradient():
    logits, labels, upstream = inputs(torch.bfloat16, scale=5.0, offset=1000.0)
    with torch.no_grad():  # make half the predictions confident (p near 1), where p - 1 loses precision in bf16
        logits[:, ::2].scatter_(-1, labels[:, ::2].unsqueeze(-1), 1100.0)
    losses = cross_entropy(logits, labels, chunk_bytes=4 * VOCAB * 7)
    (losses * upstream).sum().backward()
    expected_losses, expected_grad = reference(logits, labels, upstream)
    assert torch.isfinite(losses).all() and torch.isfinite(logits.grad).all()
    torch.testing.assert_close(losses, expected_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.grad, expected_grad, rtol=2 ** -8, atol=1e-30)


@pytest.mark.low_precision
def test_keeps_no_fp32_copy_of_half_precision_logits_for_backward():
    logits, labels, upstream = inputs(torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: saved.append(tensor) or tensor, lambda t: t):
        losses = cross_entropy(logits, labels)
    vocabulary_sized = [tensor for tensor in saved if tensor.shape[-1] == VOCAB]
    assert [tensor.dtype for tensor in vocabulary_sized] == [torch.bfloat16]
    assert vocabulary_sized[0].data_ptr() == logits.data_ptr()  # the logits themselves, not a copy
    assert sum(tensor.numel() for tensor in saved if tensor.shape[-1] != VOCAB) <= 3 * labels.numel()
    (losses * upstream).sum().backward()  # the saved tensors suffice
    assert torch.isfinite(logits.grad).all()


@pytest.mark.low_precision
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_chunk_math_matches_torch_over_uneven_chunks_in_the_logits_own_memory(dtype):
    """What CUDA runs by default (select_kernels), here through inductor's CPU backend."""
    logits, labels, upstream = inputs(dtype)
    leaf = logits
    logits = logits * 1  # not a leaf, so its gradient is written over it
    losses = cross_entropy(logits, labels, chunk_bytes=4 * VOCAB * 25, kernels=compiled_chunk_kernels(),
                           overwrite_logits=True)  # 111 rows: four chunks of 25, one of 11
    (losses * upstream).sum().backward()
    expected_losses, expected_grad = reference(leaf, labels, upstream)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-6, atol=2e-6)
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 2 ** -8}[dtype]
    torch.testing.assert_close(leaf.grad, expected_grad, rtol=tolerance, atol=tolerance * 1e-2)


def test_cuda_compiles_the_loss_chunk_math_and_a_cpu_keeps_it_eager():
    assert select_kernels("cuda").loss_kernels != EAGER_CHUNK_KERNELS
    assert select_kernels("cpu").loss_kernels == EAGER_CHUNK_KERNELS


@pytest.mark.low_precision
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_overwriting_the_logits_gives_the_same_gradient_in_their_own_memory(dtype):
    generator = torch.Generator().manual_seed(1)
    hidden, weight = (torch.randn(111, 16, generator=generator).to(dtype).requires_grad_(True),
                      torch.randn(VOCAB, 16, generator=generator).to(dtype).requires_grad_(True))
    labels, upstream = torch.randint(0, VOCAB, (111,), generator=generator), torch.randn(111, generator=generator)
    results = []
    for overwrite in (False, True):
        seen = []
        logits = hidden @ weight.t()  # not a leaf: the LM head's output
        logits.register_hook(lambda grad: seen.append(grad.data_ptr() == logits.data_ptr()))
        losses = cross_entropy(logits, labels, chunk_bytes=4 * VOCAB * 7, overwrite_logits=overwrite)
        (losses * upstream).sum().backward()
        results.append((losses.detach(), hidden.grad.clone(), weight.grad.clone(), seen))
        hidden.grad = weight.grad = None
    (losses, hidden_grad, weight_grad, seen), overwritten = results
    assert seen == [False] and overwritten[3] == [True]  # the gradient took the logits' place
    for expected, got in zip((losses, hidden_grad, weight_grad), overwritten[:3]):
        assert torch.equal(expected, got)


def test_a_leaf_is_never_overwritten():
    logits, labels, upstream = inputs(torch.float32)
    before = logits.detach().clone()
    (cross_entropy(logits, labels, overwrite_logits=True) * upstream).sum().backward()
    assert torch.equal(logits.detach(), before) and logits.grad.data_ptr() != logits.data_ptr()
