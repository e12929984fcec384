"""What the mixture-of-experts tests share (tests/model/test_moe.py, tests/checkpoint/reshape/test_moe_conversion.py): the
flags of a tiny MoE job whose routing is the same at any expert-parallel size, a training function for real ranks, the
validated flags of a job and a model whose router sends every token to one expert."""
import torch
from tests.helpers.training import TINY_FLAGS

from megatron.model.moe import is_expert_parameter

ITERATIONS = 4
# Four experts in layer 2 (upstream's --expert-interval 2), every token kept: the routing is then the same at
# any expert-parallel size. Global batch 4 = micro batch 1 x DP x accumulation steps in every layout.
MOE = ["--num-experts", "4", "--no-pipeline-parallel", "--disable-moe-token-dropping", "--moe-min-capacity", "0",
       "--zero-stage", "0"]
COMMON = [*TINY_FLAGS, "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", str(ITERATIONS),
          "--log-interval", "1", "--eval-iters", "0", "--adam-eps", "1e-4", *MOE]


def train_moe(argv):
    """pretrain() on this rank; rank 0 returns the losses, the dense weights (the experts of rank 0 are only part
    of a layer's) and the norm of all weights (--log-params-norm's)."""
    import torch.distributed as dist

    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    from megatron.training.metrics import parameters_norm

    result = pretrain(model_provider, argv)
    dense = {name: tensor.detach().clone() for name, tensor in result.model.state_dict().items()
             if not is_expert_parameter(name)}
    norm = parameters_norm(result.model, result.parallel)  # every expert once, wherever it lives
    return (result.losses, dense, norm) if dist.get_rank() == 0 else None


def validated(*extra, world_size=4):
    from megatron.config.arguments import parse_args, validate_args
    base = [*TINY_FLAGS, "--micro-batch-size", "1", "--train-iters", "4", "--mock-data", "--num-layers", "4"]
    return validate_args(parse_args(base + list(extra)), world_size, "cpu")


def skewed_model(*flags):
    """A 2-layer model whose MoE layer (4 experts) has an all-zero gate: every token's logits tie, so every
    token picks expert 0."""
    from megatron.config.arguments import job_config
    from megatron.model.gpt import GPTConfig
    from megatron.model.moe import MoEGPTModel
    moe = job_config(validated("--num-experts", "4", "--no-pipeline-parallel", "--moe-train-capacity-factor", "1.0",
                               "--num-layers", "2", *flags)).moe
    model = MoEGPTModel(GPTConfig(vocab_size=256, max_position_embeddings=32, num_layers=2, hidden_size=32,
                                  num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0, moe=moe))
    torch.nn.init.zeros_(model.layers[1].mlp.deepspeed_moe.gate.wg.weight)
    return model
