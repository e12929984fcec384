"""The GPT model as DeepSpeed pipeline stages: gpt.py's pieces as LayerSpecs, plus thin adapters for the
pipeline's calling convention (every piece takes and returns one tensor or a tuple of tensors).

The spec list has upstream Megatron-DeepSpeed's (b4d4a0e GPTModelPipe) positions, because DeepSpeed names each
piece's checkpoint file and parameters by position (layer_01-model_00-model_states.pt, '3.mlp.x'): checkpoints
then move between the two trainers and upstream's tools read ours. Upstream has parameterless steps at 0, 2 and
L+3 (a dtype cast and the [s, b, h] transposes); ours are batch-first, so those positions hold `same_inputs`.

    spec 0          same_inputs
    spec 1          EmbeddingPipe   (tokens, position_ids[, segment_ids]) -> (hidden, position_ids[, segment_ids])
    spec 2          same_inputs
    specs 3..L+2    TransformerLayerPipe, one per layer: (hidden, position_ids[, segment_ids]) -> the same
    spec L+3        same_inputs
    spec L+4        FinalLayerNormPipe: a bare LayerNorm (weight, bias) or RMSNorm (weight) that drops the mask
    spec L+5        the LM head: EmbeddingPipe again, tied (TiedLayerSpec 'embed'), scoring against its word
                    embeddings; untied (--untie-embeddings-and-output-weights), OutputLayerPipe with its own
                    weight (key `lm_head.weight`, as upstream's LMHeadPipe), and the embedding on the first stage only
    loss_fn         LanguageModelLossPipe(logits, (labels, loss_mask))

Stages are cut between transformer layers (partition "type:TransformerLayerPipe"): the first stage also holds
the embedding, the last one the final LayerNorm, the LM head and the loss. The data iterator yields
pipeline_micro_batch(batch): the first stage reads its inputs, the last one its labels and loss mask, and the
position ids (rotary embeddings) and segment ids (packed documents, when there are some) ride along between
stages with the hidden states.

Every piece is built as GPTModel builds it (same seeded_init index) and then handed to `prepare` with its path in
GPTModel (`gpt_model_path`), which under tensor parallelism shards it right away by the same plan as the plain
model (apply_tensor_parallel): a pipeline of any layout starts from the single-process weights, and DeepSpeed's
bookkeeping of tied parameters sees the final, sharded ones. The same paths name the stage's parameters as
GPTModel names them (single_process_name).
"""
import logging
from typing import Dict, Tuple

import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
from torch import nn

from megatron.errors import InputError
from megatron.model.gpt import (EMBEDDING_PIECE, Embedding, GPTConfig, LanguageModelLoss, LMHead, TransformerLayer,
                                layer_norm, layer_piece, normalize, output_layer_piece, recomputed_chunks,
                                seeded_init)
from megatron.model.parallelize import piece_sharder

_log = logging.getLogger(__name__)

TIED_EMBEDDING = "embed"  # upstream's key: the tied parameters are named tied_modules.embed.*
TIED_WEIGHT = "word_embeddings.weight"  # of the tied EmbeddingPipe: the input embedding and the LM head's weight


EMBEDDING_SPEC = 1  # spec positions (module docstring)
FIRST_LAYER_SPEC = 3


def layer_spec(layer_number: int) -> int:
    """The spec position of transformer layer `layer_number` (0-based)."""
    return FIRST_LAYER_SPEC + layer_number


def final_norm_spec(num_layers: int) -> int:
    return layer_spec(num_layers) + 1


def output_layer_spec(num_layers: int) -> int:
    """The LM head's position: an untied output layer's file (layer_{L+5})."""
    return final_norm_spec(num_layers) + 1


def pipeline_recompute_interval(config: GPTConfig) -> int:
    """DeepSpeed's activation_checkpoint_interval for the recompute flags: layers per recomputed chunk, 0 for none.
    Its PipelineModule recomputes every layer in fixed chunks, so upstream main's block method cannot be expressed."""
    if config.recompute_method == "block":
        raise InputError("--recompute-method block recomputes only the first layers of each stage, which DeepSpeed's "
                         "pipeline engine cannot do (it recomputes every layer in fixed chunks); use "
                         "--recompute-method uniform, or --no-pipeline-parallel")
    chunks = recomputed_chunks(config, config.num_layers)
    return chunks[0][1] - chunks[0][0] if chunks[0][2] else 0


def same_inputs(inputs):
    """Holds one of upstream's parameterless positions (module docstring)."""
    return inputs


def _as_tuple(inputs) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def _pack(hidden: torch.Tensor, passengers: list):
    """What a piece hands on: the hidden states alone, or with the tensors riding along."""
    return (hidden, *passengers) if passengers else hidden


class EmbeddingPipe(Embedding):
    """The embedding on the first stage and, tied to it, the LM head on the last (which scores hidden states
    against these word embeddings through `lm_head`, see lm_head_logits)."""

    gpt_model_path = "embedding"

    def __init__(self, config: GPTConfig, prepare):
        with seeded_init(config, EMBEDDING_PIECE):
            super().__init__(config)
        if not config.untie_embeddings_and_output_weights:
            self.lm_head = prepare(LMHead(config), "lm_head")  # tied: no parameters of its own
        prepare(self, self.gpt_model_path)

    def forward(self, inputs):
        tokens, *passengers = inputs
        return _pack(super().forward(tokens, passengers[0]), passengers)


def lm_head_logits(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    return embedding.lm_head(hidden, embedding.word_embeddings.weight)


class TransformerLayerPipe(TransformerLayer):
    def __init__(self, config: GPTConfig, layer_number: int, prepare):
        with seeded_init(config, layer_piece(layer_number)):
            super().__init__(config, layer_number + 1)
        self.gpt_model_path = f"layers.{layer_number}"
        prepare(self, self.gpt_model_path)

    def forward(self, inputs):
        hidden, *passengers = _as_tuple(inputs)
        return _pack(super().forward(hidden, *passengers), passengers)


class FinalLayerNormPipe(nn.Module):
    """GPTModel's final_layernorm whose parameters are this module's own `weight` and `bias`, as upstream's bare
    LayerNorm spec holds them (the norm module itself, possibly an adaptor's kernel or a sequence-parallel
    wrapper, is kept out of the state dict)."""

    gpt_model_path = "final_layernorm"

    def __init__(self, config: GPTConfig, prepare):
        super().__init__()
        norm = prepare(layer_norm(config), self.gpt_model_path)
        self.weight, self.bias = norm.weight, getattr(norm, "bias", None)
        self._norm = (norm,)  # a tuple: not registered as a submodule

    def forward(self, inputs) -> torch.Tensor:
        return normalize(self._norm[0], _as_tuple(inputs)[0])


class OutputLayerPipe(nn.Module):
    """An untied LM head on the last stage; its parameter is `lm_head.weight` here and in GPTModel."""

    gpt_model_path = ""

    def __init__(self, config: GPTConfig, prepare):
        super().__init__()
        with seeded_init(config, output_layer_piece(config)):
            self.lm_head = prepare(LMHead(config), "lm_head")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class LanguageModelLossPipe(nn.Module):
    """DeepSpeed calls loss_fn(outputs, labels) with the second item of the micro-batch as `labels`."""

    def __init__(self, config: GPTConfig, prepare):
        super().__init__()
        self.loss = prepare(LanguageModelLoss(config.kernels.loss_chunk_bytes, config.kernels.loss_kernels), "loss")

    def forward(self, logits: torch.Tensor, labels_and_loss_mask: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        labels, loss_mask = labels_and_loss_mask
        return self.loss(logits, labels, loss_mask)


def compiled_pieces(stage: PipelineModule) -> list:
    """The modules of a stage that --torch-compile compiles (model/provider.py's apply_torch_compile): each piece
    the engine calls, and the LM head (whichever module the tensor-parallel plan made it), which the tied spec
    calls through lm_head_logits rather than as a piece."""
    pieces = [module for module in stage.modules()
              if isinstance(module, (EmbeddingPipe, TransformerLayerPipe, FinalLayerNormPipe, LanguageModelLossPipe))]
    heads = [module.lm_head for module in stage.modules() if isinstance(module, (EmbeddingPipe, OutputLayerPipe))
             and getattr(module, "lm_head", None) is not None]
    return pieces + heads


def pipeline_micro_batch(batch: dict) -> tuple:
    """A micro-batch of data/gpt_batch.make_batch as DeepSpeed's pipeline engine reads it: (first-stage inputs,
    last-stage labels). The segment ids are left out when each row is one stream."""
    inputs = (batch["tokens"], batch["position_ids"])
    if batch.get("segment_ids") is not None:
        inputs += (batch["segment_ids"],)
    return inputs, (batch["labels"], batch["loss_mask"])


class GPTPipe(PipelineModule):
    """This rank's pipeline stage of the GPT model, built from LayerSpecs and parallelised as parallel_state
    says (stages over its pipeline group, pieces sharded over its tensor group).

    Sequence lengths may change from batch to batch (dynamic_shape): stages tell each other the shapes they
    send, so nothing about the parallel plan is fixed to one length. For the same reason, and because with
    sequence parallelism stage outputs differ between tensor-parallel ranks, the engine must not split stage
    outputs over the tensor group (see training.engine_config).
    """

    def __init__(self, config: GPTConfig, parallel_state, rng_tracker, sequence_parallel: bool = False):
        layout = parallel_state.layout
        prepare = piece_sharder(parallel_state, sequence_parallel, rng_tracker)

        # Untied, the embedding keeps its tied spec (held by the first stage alone), so its names stay the same.
        head = (LayerSpec(OutputLayerPipe, config, prepare) if config.untie_embeddings_and_output_weights else
                TiedLayerSpec(TIED_EMBEDDING, EmbeddingPipe, config, prepare, forward_fn=lm_head_logits,
                              tied_weight_attr=TIED_WEIGHT))
        specs = [same_inputs,
                 TiedLayerSpec(TIED_EMBEDDING, EmbeddingPipe, config, prepare, tied_weight_attr=TIED_WEIGHT),
                 same_inputs,
                 *(LayerSpec(TransformerLayerPipe, config, number, prepare) for number in range(config.num_layers)),
                 same_inputs,
                 LayerSpec(FinalLayerNormPipe, config, prepare),
                 head]
        # no_grad: DeepSpeed synchronises the tied weights here with an in-place broadcast, which autograd would
        # otherwise record on the parameters and warn about in every backward.
        with torch.no_grad():
            super().__init__(
                specs, topology=PipeModelDataParallelTopology(num_pp=layout.pipeline, num_mp=layout.tensor,
                                                              num_dp=layout.data),
                loss_fn=LanguageModelLossPipe(config, prepare),
                partition_method=f"type:{TransformerLayerPipe.__name__}",
                activation_checkpoint_interval=pipeline_recompute_interval(config),
                activation_checkpoint_func=rng_tracker.checkpoint,
                checkpointable_layers=[TransformerLayerPipe.__name__], dynamic_shape=True)
        self.num_transformer_layers = config.num_layers
        if dist.get_rank() == 0:
            _log.info(f"pipeline: transformer layers per stage {self.layers_per_stage()}")

    def layers_per_stage(self) -> list:
        """How many transformer layers each stage holds (uneven when --num-layers is not a multiple of the
        number of stages)."""
        first_layer, after_last_layer = layer_spec(0), layer_spec(self.num_transformer_layers)
        return [max(0, min(int(stop), after_last_layer) - max(int(start), first_layer))
                for start, stop in zip(self.parts[:-1], self.parts[1:])]

    def single_process_name(self, name: str) -> str:
        """GPTModel's name for a parameter of this stage: its piece's path in GPTModel, then its name inside the
        piece ('tied_modules.embed.x' -> 'embedding.x', '4.mlp.x' -> 'layers.1.mlp.x',
        '<L+4>.weight' -> 'final_layernorm.weight')."""
        parts = name.split(".")
        owner = 2 if parts[0] == "tied_modules" else 1
        piece = self.get_submodule(".".join(parts[:owner]))
        return ".".join(filter(None, [piece.gpt_model_path, *parts[owner:]]))

    @staticmethod
    def single_process_state_dict(stage_state: Dict[str, torch.Tensor], pipeline_group) -> Dict[str, torch.Tensor]:
        """GPTModel's state dict from every stage's `stage_state`, already named as in GPTModel (a collective
        over the pipeline group). The tied embedding is taken from the first stage, which is the one that uses
        its position embeddings."""
        stages = [None] * dist.get_world_size(pipeline_group)
        dist.all_gather_object(stages, {name: tensor.cpu() for name, tensor in stage_state.items()},
                               group=pipeline_group)
        full = {}
        for stage in stages:
            for name, tensor in stage.items():
                full.setdefault(name, tensor)
        return full
