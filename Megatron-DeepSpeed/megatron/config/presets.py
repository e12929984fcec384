"""Model-size presets: each family's table (megatron/families/<name>/presets.py, listed by families/registry.py)
as the flags they set; the single source of the numbers in docs/training.md, Presets.

`--model-size NAME`, the shell entry points, the planner and the device check all read them through here, so a
size is changed in one place. A preset maps argparse attribute names (Megatron flags, dashes as underscores) to
values.

    python -m megatron.config.presets 345M                  # KEY=VALUE lines for `eval` in bash
    python -m megatron.config.presets 345M --format flags   # Megatron flags, one per line
    python -m megatron.config.presets 345M --format json
"""
import argparse
import json
import shlex

from megatron.errors import InputError, run_cli
from megatron.families.family import Preset
from megatron.families.registry import presets

# A performance run is the first 300 iterations of the full run: same LR schedule, cut short.
PERFORMANCE_RUN_ITERS = 300
RUN_KINDS = ("full", "performance")


def preset_names():
    """Valid preset names, in table order."""
    return tuple(size.name for size in presets())


def get_preset(name, run="full"):
    """A fresh dict of argparse attribute -> value for preset `name`.

    run="performance" only shortens training to PERFORMANCE_RUN_ITERS; the LR schedule is kept.
    """
    sizes = {size.name: size for size in presets()}
    if name not in sizes:
        raise InputError(f"unknown model size preset {name!r}; valid names: "
                         f"{', '.join(preset_names())}")
    if run not in RUN_KINDS:
        raise InputError(f"unknown run kind {run!r}; valid kinds: {', '.join(RUN_KINDS)}")
    size = sizes[name]
    return {
        "tensor_model_parallel_size": size.tp,
        "pipeline_model_parallel_size": size.pp,
        "num_layers": size.layers,
        "hidden_size": size.hidden,
        "num_attention_heads": size.heads,
        "seq_length": size.seq,
        "micro_batch_size": size.micro_bs,
        "global_batch_size": size.global_bs,
        "lr": size.lr,
        "min_lr": size.min_lr,
        "no_pipeline_parallel": size.no_pipeline,
        "checkpoint_activations": True,
        "lr_decay_style": "cosine",
        "lr_warmup_fraction": 0.01,
        "split": "949,50,1",
        "seed": 1234,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "train_iters": size.full_run_iters if run == "full" else PERFORMANCE_RUN_ITERS,
        "lr_decay_iters": size.lr_decay_iters,
        **_moe_values(size),
        **size.model_flags,
    }


def _moe_values(size: Preset) -> dict:
    if size.experts == 1:
        return {}
    return {"num_experts": [size.experts], "moe_expert_parallel_size": size.expert_parallel, "moe_loss_coeff": 0.01}


def format_shell(preset):
    """KEY=VALUE lines (upper-case attribute names, booleans as true/false) for `eval` in bash."""
    def shell_value(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return shlex.quote(" ".join(map(str, value)))
        return shlex.quote(str(value))
    return "".join(f"{key.upper()}={shell_value(value)}\n" for key, value in preset.items())


# Destinations whose flag is not the destination's name: written as upstream spells them.
_SPELLED = {"rope_theta": "--rotary-position-embeddings-theta"}
_TURNED_OFF_BY = {"add_bias_linear": "--disable-bias-linear", "add_position_embedding": "--no-position-embedding"}


def format_flags(preset):
    """Megatron flags one per line; a false boolean flag is left out, as on a command line (a false one whose flag
    turns it off is written as that flag)."""
    lines = []
    for key, value in preset.items():
        flag = _SPELLED.get(key, "--" + key.replace("_", "-"))
        if key in _TURNED_OFF_BY:
            if value is False:
                lines.append(_TURNED_OFF_BY[key])
        elif value is True:
            lines.append(flag)
        elif isinstance(value, list):
            lines.append(" ".join([flag, *map(str, value)]))
        elif value is not False:
            lines.append(f"{flag} {value}")
    return "".join(line + "\n" for line in lines)


def format_json(preset):
    """One JSON object, for tools other than bash."""
    return json.dumps(preset, indent=2) + "\n"


_FORMATTERS = {"shell": format_shell, "flags": format_flags, "json": format_json}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m megatron.config.presets",
        description="Print a model-size preset so shell scripts need not hard-code its numbers.")
    parser.add_argument("name", help=f"one of: {', '.join(preset_names())}")
    parser.add_argument("--format", choices=sorted(_FORMATTERS), default="shell",
                        help="shell: KEY=VALUE lines for eval; flags: Megatron flags one per line; "
                             "json: one object")
    parser.add_argument("--run", choices=RUN_KINDS, default="full",
                        help=f"performance runs stop after {PERFORMANCE_RUN_ITERS} iterations")
    options = parser.parse_args(argv)
    print(_FORMATTERS[options.format](get_preset(options.name, options.run)), end="")
    return 0


if __name__ == "__main__":
    run_cli(main)
