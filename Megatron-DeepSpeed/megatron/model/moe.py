"""Mixture of experts on DeepSpeed's MoE layer (deepspeed.moe.layer.MoE): its top-k gate, capacity and token
dropping, all-to-all between expert-parallel ranks, and expert-parallel groups. Nothing here routes tokens.

MoEGPTModel is model/gpt.py's GPTModel whose MLP in every MoE layer (config.moe says which: upstream's
--expert-interval rule) is an ExpertsMLP. As upstream, it adds the gates' load-balancing losses, times
--moe-loss-coeff, to the LM loss, and keeps both apart for the log ("lm loss", "moe loss"). The losses leave
each recomputed chunk of layers as outputs, so their gradients survive DeepSpeed's reentrant recomputation.

Weights: each global expert draws its initial weights from a stream of its own (the layer's piece seed and the
expert's global index), so a layer's experts differ from the start and the model is the same at every
expert-parallel size; the gate and PR-MoE's dense MLP come from the layer's own stream, as in a dense layer.
Parameter names are DeepSpeed's (`layers.N.mlp.deepspeed_moe.experts.deepspeed_experts.E....`, `E` local to
the expert-parallel rank), which its checkpoints renumber to the global expert index.
"""
import functools
from typing import Optional

import torch
import torch.distributed as dist
from deepspeed.moe.layer import MoE
from deepspeed.utils import groups
from torch import nn

from megatron.model.gpt import MLP, GPTConfig, GPTModel, init_linear, layer_inputs, layer_piece, seeded_init

EXPERT_SEED_STRIDE = 1_000_003  # keeps the experts' streams apart from the pieces' (seed + piece index)


class ExpertsMLP(MoE):
    """DeepSpeed's MoE layer where a TransformerLayer has its MLP: hidden states in, hidden states out. The
    gate's load-balancing loss and the expert assignments it dropped for want of capacity are kept from the last
    forward for the model to collect."""

    def __init__(self, config: GPTConfig, num_experts: int):
        moe = config.moe
        super().__init__(config.hidden_size, MLP(config), num_experts=num_experts,
                         ep_size=moe.expert_parallel_size, k=moe.topk,
                         capacity_factor=moe.train_capacity_factor, eval_capacity_factor=moe.eval_capacity_factor,
                         min_capacity=moe.min_capacity, use_residual=moe.mlp_type == "residual",
                         drop_tokens=moe.token_dropping,
                         enable_expert_tensor_parallelism=moe.expert_tensor_parallel)
        self.aux_loss: Optional[torch.Tensor] = None
        self.dropped: Optional[torch.Tensor] = None  # expert assignments over capacity in the last forward
        self.deepspeed_moe.gate.register_forward_hook(self._count_dropped)

    def _count_dropped(self, gate, inputs, routes) -> None:
        """The gate returns sparse routes (DeepSpeed's MOELayer asks for them): an expert index of -1 marks an
        assignment that found its expert full."""
        self.dropped = (routes[3] < 0).sum().detach()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        output, self.aux_loss, _ = super().forward(hidden)
        return output


def seed_experts(layer: ExpertsMLP, config: GPTConfig, layer_number: int, expert_parallel_rank: int) -> None:
    """Give each local expert the weights of its global index (see the module docstring)."""
    for local, expert in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
        global_index = expert_parallel_rank * layer.num_local_experts + local
        with seeded_init(config, layer_piece(layer_number) + EXPERT_SEED_STRIDE * (1 + global_index)):
            init_linear(expert.dense_h_to_4h, config.init_method_std, config)
            init_linear(expert.dense_4h_to_h, config.output_layer_init_std, config)


def expert_parallel_rank(moe, parallel_state) -> int:
    """This process's rank in its expert-parallel group (0 without process groups). Creates DeepSpeed's expert-
    parallel and expert-data-parallel groups as its MoE layer would, so that the experts can be seeded before the
    engine exists; the engine then finds the groups made. Whole experts: consecutive ranks share experts' tokens.
    Experts split over tensor-parallel ranks (`moe.expert_tensor_parallel`, `parallel_state` the mpu): each
    expert-parallel group lies inside one data-parallel group, so tensor-parallel ranks hold shards of the same
    experts. Every rank must call it."""
    if not dist.is_initialized():
        return 0
    name = f"ep_size_{moe.expert_parallel_size}"  # the MoE layer's group name
    if name not in groups._get_expert_parallel_group_dict():
        if moe.expert_tensor_parallel:
            groups._create_expert_data_and_model_parallel(moe.expert_parallel_size, mpu=parallel_state)
        else:
            groups._create_expert_and_data_parallel(moe.expert_parallel_size)
    return groups._get_expert_parallel_rank(name)


def run_moe_layers(layers, names: tuple, hidden: torch.Tensor, *tensors: torch.Tensor):
    """The layers on `hidden` (keyword inputs as gpt.run_layers), and the sum of their MoE layers' load-balancing
    losses."""
    aux = torch.zeros((), dtype=torch.float32, device=hidden.device)
    inputs = dict(zip(names, tensors))
    for layer in layers:
        hidden = layer(hidden, **inputs)
        if isinstance(layer.mlp, ExpertsMLP):
            aux = aux + layer.mlp.aux_loss.float()
    return hidden, aux


class MoEGPTModel(GPTModel):
    """GPTModel with DeepSpeed MoE layers (see the module docstring). `expert_parallel_rank`: this rank's place
    in its expert-parallel group (0 in a single process holding every expert)."""

    def __init__(self, config: GPTConfig, expert_parallel_rank: int = 0):
        super().__init__(config)
        for index, layer in enumerate(self.layers):
            num_experts = config.moe.experts_of_layer(index + 1)
            if num_experts > 1:
                with seeded_init(config, layer_piece(index)):
                    layer.mlp = ExpertsMLP(config, num_experts)
                seed_experts(layer.mlp, config, index, expert_parallel_rank)
        self.moe_layers = [layer.mlp for layer in self.layers if isinstance(layer.mlp, ExpertsMLP)]
        self.aux_loss: Optional[torch.Tensor] = None
        self.lm_loss_sum = torch.zeros(())  # since the last take_loss_sums(): LM and MoE losses (detached),
        self.moe_loss_sum = torch.zeros(())  # dropped expert assignments and forward passes with labels
        self.dropped_sum = torch.zeros((), dtype=torch.int64)
        self.forwards = 0

    def transformer(self, hidden: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                    segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        names, tensors = layer_inputs(position_ids, segment_ids)
        self.aux_loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for chunk, recomputed in self.layer_chunks():
            run = functools.partial(run_moe_layers, chunk, names)
            hidden, aux = self.checkpoint_layer(run, hidden, *tensors) if recomputed else run(hidden, *tensors)
            self.aux_loss = self.aux_loss + aux
        return hidden

    def forward(self, tokens: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                segment_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """As GPTModel's; given labels, the LM loss plus --moe-loss-coeff x the load-balancing losses."""
        output = super().forward(tokens, position_ids, segment_ids, labels, loss_mask)
        if labels is None:
            return output
        moe_loss = self.config.moe.loss_coeff * self.aux_loss
        self.lm_loss_sum = self.lm_loss_sum.to(output.device) + output.detach().float()
        self.moe_loss_sum = self.moe_loss_sum.to(output.device) + moe_loss.detach()
        dropped = sum(layer.dropped for layer in self.moe_layers)
        self.dropped_sum = self.dropped_sum.to(output.device) + dropped
        self.forwards += 1
        return output + moe_loss.to(output.dtype)

    def take_loss_sums(self) -> tuple:
        """(LM loss sum, MoE loss sum, dropped assignments, forwards) since the last call; the sums restart."""
        sums = (self.lm_loss_sum, self.moe_loss_sum, self.dropped_sum, self.forwards)
        self.lm_loss_sum, self.moe_loss_sum = torch.zeros(()), torch.zeros(())
        self.dropped_sum, self.forwards = torch.zeros((), dtype=torch.int64), 0
        return sums


def is_expert_parameter(name: str) -> bool:
    """Whether a parameter of MoEGPTModel (by name) belongs to one expert, held by one expert-parallel rank."""
    return ".deepspeed_moe.experts." in name


def build_model(config: GPTConfig) -> GPTModel:
    """The single-process model of `config`: a GPTModel, or an MoEGPTModel holding every expert (for reading,
    converting and generating; its MoE section must say expert-parallel size 1)."""
    return GPTModel(config) if config.moe is None else MoEGPTModel(config)


def active_parameter_count(model: nn.Module) -> int:
    """Parameters of `model` (this rank's) that one token uses: all but the experts, plus, in each MoE layer, top-k
    experts' worth (every expert of a layer has the same size)."""
    count = sum(parameter.numel() for name, parameter in model.named_parameters() if not is_expert_parameter(name))
    for module in model.modules():
        if isinstance(module, ExpertsMLP):
            one_expert = sum(p.numel() for p in module.deepspeed_moe.experts.deepspeed_experts[0].parameters())
            count += module.deepspeed_moe.gate.k * one_expert
    return count
