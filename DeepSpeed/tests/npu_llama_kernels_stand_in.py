"""Stand-ins for torch_npu's npu_rms_norm, npu_rotary_mul and npu_swiglu whose Python signatures are the
operators' schemas and whose arithmetic and input checks follow their documentation.

SCHEMAS are the declarations in Ascend/op-plugin, op_plugin/config/op_plugin_functions.yaml at commit
517f2e7d0f202f38b76310706cb977ca2388ad21 (each `exposed: all_version`; backward through derivatives.yaml:
npu_rms_norm_backward, npu_rotary_mul_backward, npu_swiglu_backward, so autograd differentiates them on the
device as it does these torch expressions here). The documentation, same commit, docs/zh/custom_APIs/torch_npu/:
- (beta) npu_rms_norm: RmsNorm(x) = x / sqrt(mean(x^2) + eps) * gamma over gamma's trailing dims; returns it and
  rstd (float32, self's leading dims). self has 2 to 8 dims, format ND, non-contiguous allowed; gamma's shape is
  self's trailing dims (self_shape[n:], n < self's dims), usually the last (the same page at op-plugin commit
  09fca6f6ccbac9efdfbad819cebc53c2b6d13aeb, 参数说明).
- npu_rotary_mul: output = x * cos + rotate(x) * sin; half mode rotate(x) = cat(-x2, x1) of x's two halves;
  x 3 or 4 dims (non-contiguous allowed), D even and below 896; for BNSD x, r1 / r2 are 11SD, B1SD or BNSD; for
  BSND x, 1S1D, BS1D or BSND (the layout is read from the tables' shapes).
- (beta) npu_swiglu: A, B = the halves of self along dim; swish(A) * B = A * sigmoid(A) * B; the dim must be
  even and non-contiguous tensors are not supported.
"""
import torch

SCHEMAS = {
    "npu_rms_norm": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_rotary_mul": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', "
                      "Tensor? rotate=None) -> Tensor",
    "npu_swiglu": "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
}


def npu_rms_norm(self, gamma, epsilon=1e-06):
    assert 2 <= self.dim() <= 8 and gamma.dim() < self.dim() and self.shape[-gamma.dim():] == gamma.shape
    reduced = tuple(range(-gamma.dim(), 0))
    rstd = torch.rsqrt(self.float().pow(2).mean(dim=reduced) + epsilon)
    output = self.float() * rstd.reshape(*rstd.shape, *([1] * gamma.dim())) * gamma.float()
    return output.to(self.dtype), rstd


def npu_rotary_mul(self, r1, r2, rotary_mode='half', rotate=None):
    assert rotary_mode == "half" and rotate is None  # the mode deepspeed_npu uses
    assert self.dim() in (3, 4) and self.shape[-1] % 2 == 0 and self.shape[-1] < 896
    bnsd = r1.shape[2] == self.shape[2] and r1.shape[1] in (1, self.shape[1])
    batch, heads, seq, dim = self.shape if bnsd else self.shape[0], self.shape[2], self.shape[1], self.shape[3]
    for table in (r1, r2):
        per_head, sequence = (table.shape[1], table.shape[2]) if bnsd else (table.shape[2], table.shape[1])
        assert (sequence, table.shape[3]) == (seq, dim) and table.shape[0] in (1, batch) and per_head in (1, heads)
        assert per_head == 1 or table.shape[0] == batch  # 11SD, B1SD, BNSD / 1S1D, BS1D, BSND
    first, second = self.chunk(2, dim=-1)
    return self * r1 + torch.cat((-second, first), dim=-1) * r2


def npu_swiglu(self, dim=-1):
    assert self.is_contiguous() and self.shape[dim] % 2 == 0
    first, second = self.chunk(2, dim=dim)
    return first * torch.sigmoid(first) * second
