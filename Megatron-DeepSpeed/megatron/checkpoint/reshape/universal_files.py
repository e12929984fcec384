"""DeepSpeed's universal per-parameter files, which target_writer.py writes beside the model files:
zero/<engine parameter name>/{fp32,exp_avg,exp_avg_sq,step}.pt and zero/optimizer_state.pt. Each parameter's
files are written when the writer first holds its full tensor for a model file, so a streamed source
(weight_units.StreamedWeights) is read once for both, not once more after the model files."""
import importlib.metadata
import os
from typing import Dict, Iterable, Mapping, Optional

import torch
from deepspeed.checkpoint.constants import CAT_DIM, PARAM_N_SUB_PARAMS

from megatron.checkpoint.file_names import UNIVERSAL_DIR
from megatron.checkpoint.parameter_names import stage_name
from megatron.checkpoint.formats.checkpoint import OptimizerState
from megatron.checkpoint.torch_files import save
from megatron.checkpoint.shards import split_dim
from megatron.checkpoint.formats.weight_units import Progress


class UniversalFiles:
    """The universal files of `model` (GPTModel's full state dict) and, unless None, `optimizer`, written one
    parameter at a time in the order the writer asks for them; finish() writes the rest and the shared state."""

    def __init__(self, tag_dir: str, model: Mapping[str, torch.Tensor], optimizer: Optional[OptimizerState],
                 num_layers: int, pipeline_engine: bool, split_experts: bool, swiglu: bool, progress: Progress):
        self._folder = os.path.join(tag_dir, UNIVERSAL_DIR)
        self._model, self._optimizer, self._progress = model, optimizer, progress
        self._num_layers, self._pipeline_engine, self._split_experts = num_layers, pipeline_engine, split_experts
        self._swiglu = swiglu
        self._shapes: Dict[str, torch.Size] = {}  # the parameters written, with their full shapes

    def write(self, names: Iterable[str]) -> None:
        """The files of each of `names` not written yet."""
        for name in names:
            if name not in self._shapes:
                self._write(name)

    def shape(self, name: str) -> torch.Size:
        """The full shape of parameter `name` (its files written first, reading its tensors if not yet)."""
        self.write([name])
        return self._shapes[name]

    def _write(self, name: str) -> None:
        self._progress(f"writing per-parameter state {len(self._shapes) + 1}/{len(self._model)}: {name}")
        engine_name = stage_name(name, self._num_layers) if self._pipeline_engine else name
        folder = os.path.join(self._folder, engine_name)
        split = split_dim(name, self._split_experts, self._swiglu)
        # How DeepSpeed's universal loader cuts it per rank: a SwiGLU MLP's halves separately (sub-parameters).
        cut = {CAT_DIM: 0 if split is None else split.dim, **({PARAM_N_SUB_PARAMS: split.blocks}
                                                              if split is not None and split.blocks > 1 else {})}
        optimizer = self._optimizer
        kinds = {"fp32": self._model[name].float() if optimizer is None else optimizer.fp32[name]}
        if optimizer is not None:
            kinds.update(exp_avg=optimizer.exp_avg[name], exp_avg_sq=optimizer.exp_avg_sq[name])
            save(os.path.join(folder, "step.pt"), torch.tensor(float(optimizer.step)))
        for kind, tensor in kinds.items():
            save(os.path.join(folder, f"{kind}.pt"), {"param": tensor.contiguous(), **cut})
        self._shapes[name] = kinds["fp32"].shape

    def finish(self, clip_grad: float) -> None:
        """Every parameter not written yet, then zero/optimizer_state.pt."""
        self.write(self._model)
        # No hyperparameters: DeepSpeed's ZeRO-3 loader would give every group the first group's (weight decay on
        # biases and LayerNorms); without them each group keeps the resumed run's own (its flags).
        groups = [{}, {}]  # decayed, not decayed (megatron/optimizer.parameter_groups)
        step = torch.tensor(float(self._optimizer.step if self._optimizer is not None else 0))
        save(os.path.join(self._folder, "optimizer_state.pt"),
             {"ds_version": importlib.metadata.version("deepspeed"), "clip_grad": clip_grad, "param_groups": groups,
              "optimizer_state_dict": {"state": {0: {"step": step}}, "param_groups": groups}})
