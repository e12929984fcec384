"""A Hugging Face config.json's rotary embedding <-> our rotary flags (rope_theta and the rotary scaling of
families/rope_scaling.py), for every adapter whose model rotates queries and keys.

transformers 5.x writes one object, `rope_parameters` ({"rope_type", "rope_theta", and the type's keys});
4.x wrote `rope_theta` beside `rope_scaling` (the type's keys, the type under "rope_type" or, older, "type"; null
when unscaled). Reading takes either, as transformers 5.23 does (a non-null rope_scaling first): a missing
original context is the model's max_position_embeddings (a top-level `original_max_position_embeddings` first), a
YaRN factor left out is max_position_embeddings over it, YaRN's mscale pair counts only when both are non-zero,
beta_fast / beta_slow left out or 0 are 32 / 1. Writing gives 5.23's `rope_parameters` and the 4.x keys beside it
(both read back the same). Types whose frequencies change with the sequence length (dynamic, longrope) or that we do not know are
refused in one line naming them.
"""
from typing import Mapping

from megatron.errors import InputError
from megatron.families.adapter import ModelFlags
from megatron.families.rope_scaling import RopeScaling

DEFAULT_TYPE = "default"
DEFAULT_THETA = 10000.0  # transformers' default_theta
# Our flag -> its rope_parameters key, per type (beyond rope_type, rope_theta and factor).
_LLAMA3_KEYS = {"rope_scaling_low_freq_factor": "low_freq_factor", "rope_scaling_high_freq_factor": "high_freq_factor",
                "rope_scaling_original_max_position_embeddings": "original_max_position_embeddings"}
_YARN_KEYS = {"rope_scaling_original_max_position_embeddings": "original_max_position_embeddings",
              "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow",
              "yarn_correction_range_round_to_int": "truncate"}
_TYPE_KEYS = {"linear": {}, "llama3": _LLAMA3_KEYS, "yarn": _YARN_KEYS}
ORIGINAL = "original_max_position_embeddings"


def rope_parameters(config: Mapping[str, object], path: str) -> dict:
    """The rotary object of a config.json in 5.x's form (rope_type and rope_theta always present)."""
    parameters = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        raise InputError(f"{path} sets rope_parameters/rope_scaling to {parameters!r}; expected an object")
    kind = parameters.get("rope_type", parameters.get("type", DEFAULT_TYPE))
    theta = parameters.get("rope_theta", config.get("rope_theta", DEFAULT_THETA))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
        raise InputError(f"{path} sets rope_theta {theta!r}; the rotary base must be a positive number (the "
                         f"default is {DEFAULT_THETA:g})")
    return {**{key: value for key, value in parameters.items() if key != "type"}, "rope_type": kind,
            "rope_theta": float(theta)}


def rope_flags_from_hf(config: Mapping[str, object], path: str) -> dict:
    """Our rotary flags (rope_theta, rope_scaling_*, yarn_*) of a config.json; InputError for a rotary type we do not
    compute or a scaled type without its factor."""
    parameters = rope_parameters(config, path)
    kind, theta = parameters["rope_type"], parameters["rope_theta"]
    flags = {"rope_theta": int(theta) if theta.is_integer() else theta}
    if kind == DEFAULT_TYPE:
        return flags
    if kind not in _TYPE_KEYS:
        raise InputError(f"{path} uses rotary type '{kind}'; only default, {', '.join(_TYPE_KEYS)} can be imported "
                         "(their frequencies do not change with the sequence length)")
    if kind in ("llama3", "yarn"):
        parameters[ORIGINAL] = config.get(ORIGINAL) or parameters.get(ORIGINAL) or config.get("max_position_embeddings")
    if kind == "yarn":
        flags.update(_yarn_defaults(parameters, config))
    if parameters.get("factor") is None:
        raise InputError(f"{path} uses rotary scaling '{kind}' without a factor; add rope_parameters.factor")
    flags.update({"rope_scaling_type": kind, "rope_scaling_factor": parameters["factor"]})
    flags.update({flag: parameters[key] for flag, key in _TYPE_KEYS[kind].items() if parameters.get(key) is not None})
    return flags


def _yarn_defaults(parameters: dict, config: Mapping[str, object]) -> dict:
    """transformers' YaRN rules for keys left out, filled into `parameters`; the attention-factor flags they give."""
    if parameters.get("factor") is None and parameters[ORIGINAL]:
        parameters["factor"] = config.get("max_position_embeddings") / parameters[ORIGINAL]
    parameters["beta_fast"] = parameters.get("beta_fast") or 32.0
    parameters["beta_slow"] = parameters.get("beta_slow") or 1.0
    if parameters.get("attention_factor") is not None:
        return {"yarn_attention_factor": parameters["attention_factor"]}
    if parameters.get("mscale") and parameters.get("mscale_all_dim"):
        return {"yarn_mscale": parameters["mscale"], "yarn_mscale_all_dim": parameters["mscale_all_dim"]}
    return {}


def rope_to_hf(model: ModelFlags) -> dict:
    """config.json's rotary keys for `model`: 5.23's rope_parameters and 4.x's rope_theta / rope_scaling."""
    theta = float(model.rope_theta)
    kind = model.rope_scaling_type
    if kind is None:
        return {"rope_theta": theta, "rope_scaling": None,
                "rope_parameters": {"rope_type": DEFAULT_TYPE, "rope_theta": theta}}
    scaling = {"rope_type": kind, "factor": model.rope_scaling_factor,
               **{key: getattr(model, flag) for flag, key in _TYPE_KEYS[kind].items()}}
    if kind == "yarn":
        scaling.update(_yarn_attention_keys(model))
    return {"rope_theta": theta, "rope_scaling": scaling,
            "rope_parameters": {"rope_type": kind, "rope_theta": theta, **scaling}}


def _yarn_attention_keys(model: ModelFlags) -> dict:
    """The keys that give transformers our YaRN attention factor: the mscale pair where its rule reads them (both
    non-zero), else the factor itself."""
    if model.yarn_attention_factor is not None:
        return {"attention_factor": model.yarn_attention_factor}
    if (model.yarn_mscale, model.yarn_mscale_all_dim) == (1.0, 0.0):
        return {}  # transformers' default: 0.1 ln(factor) + 1
    if model.yarn_mscale and model.yarn_mscale_all_dim:
        return {"mscale": model.yarn_mscale, "mscale_all_dim": model.yarn_mscale_all_dim}
    return {"attention_factor": RopeScaling("yarn", model.rope_scaling_factor, mscale=model.yarn_mscale,
                                            mscale_all_dim=model.yarn_mscale_all_dim).cos_sin_scale}


def describe_rope(config: Mapping[str, object]) -> str:
    """One line for the examiner: the rotary base and its scaling."""
    parameters = rope_parameters(config, "config.json")
    scaling = {key: value for key, value in parameters.items() if key not in ("rope_type", "rope_theta")}
    kind = parameters["rope_type"]
    return f"rotary base: {parameters['rope_theta']}" + (
        "" if kind == DEFAULT_TYPE else f", scaling {kind} " + ", ".join(f"{k}={v}" for k, v in scaling.items()))
