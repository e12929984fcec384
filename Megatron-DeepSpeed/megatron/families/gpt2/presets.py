"""GPT-2's --model-size presets.

345M_without_mp: pure data parallel over 8 devices (ZeRO stage 1 is the default), micro batch 8 fits a 345M model
with activation checkpointing on a 32 GB device; global 64 = 8 x DP 8, so one micro batch per step, which is what a
throughput comparison wants; lr as for 345M.
tiny: TP2 x PP2 x DP2 over 8 CPU processes exercises every parallel axis; 4 layers split evenly over 2 stages, 4
heads split over TP 2, global 8 = micro 2 x DP 2 x 2 micro batches, so gradient accumulation and pipeline overlap
both happen. 300 iterations take a few minutes on 2 cores, and the schedule decays over exactly those 300 (a
500k-iteration "full" run would be no demo).
125M_MoE64, 1.3B_MoE128: upstream's examples/MoE/ds_pretrain_gpt_125M_MoE64.sh and ds_pretrain_gpt_1.3B_MoE128.sh
(b4d4a0e): their shapes, batches and learning rates, --moe-loss-coeff 0.01, no pipeline (upstream runs MoE without
one), experts spread over one node's 8 ranks (upstream's EP_PARALLEL_SIZE = min(experts, devices) at 8 devices).
Upstream runs 1.3B_MoE128 on NUM_GPUS=64 at EP 64: on one node of 80 GiB devices it does not fit (the planner and
the entry scripts say so); on 8 nodes add --moe-expert-parallel-size 64.
"""
from megatron.families.family import Preset

PRESETS = (
    #      name               TP PP layers hidden heads  seq  mbs gbs  lr      min lr
    Preset("345M",             1, 2, 24,    1024,  16,   1024, 4,  16, 1.5e-4, 1.5e-5),
    Preset("1.3B",             2, 2, 24,    2048,  16,   1024, 8,  32, 2e-4,   2e-5),
    Preset("2.7B",             2, 2, 32,    2560,  32,   2048, 8,  32, 1.6e-4, 1.6e-5),
    Preset("3.7B",             2, 2, 32,    3072,  32,   2048, 4,  16, 1.2e-4, 1.2e-5),
    Preset("345M_without_mp",  1, 1, 24,    1024,  16,   1024, 8,  64, 1.5e-4, 1.5e-5,
           no_pipeline=True),
    Preset("125M_MoE64",       1, 1, 12,    768,   12,   2048, 4,  256, 4.5e-4, 4.5e-6,
           no_pipeline=True, experts=64, expert_parallel=8),
    Preset("1.3B_MoE128",      1, 1, 24,    2048,  16,   2048, 8,  512, 1.2e-4, 1.0e-6,
           no_pipeline=True, experts=128, expert_parallel=8),
    Preset("tiny",             2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
           full_run_iters=300, lr_decay_iters=300),
)
