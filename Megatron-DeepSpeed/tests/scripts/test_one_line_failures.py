"""User mistakes that used to end in a traceback, an absurd allocation or a misleading message, each refused in
one line naming the file or flag (or, for blend weights, accepted as meant), on real files
(docs/failure-cases.md)."""
import json

import numpy as np
import pytest
from tests.checkpoint.convert.test_conversions import HF_VOCAB, hf_model

from megatron.checkpoint.convert.conversions import import_hf
from megatron.checkpoint.convert.examine import examine
from megatron.checkpoint.convert.target_writer import TargetLayout
from megatron.data.blendable_dataset import BlendableDataset
from megatron.data.token_range import check_token_ids
from megatron.errors import InputError
from megatron.inference.sampling import SamplingParams


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf") / "gpt2"
    hf_model().save_pretrained(directory)
    return directory


def with_config(hf_dir, tmp_path, **changes):
    """A copy of `hf_dir` whose config.json has `changes`."""
    copy = tmp_path / "hf"
    copy.mkdir()
    for file in hf_dir.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **changes}))
    return copy


@pytest.mark.parametrize("changes, message", [
    ({"n_inner": 64}, "tensor 'transformer.h.0.mlp.c_fc.bias' has shape [48], but "),
    ({"vocab_size": HF_VOCAB + 20}, f"tensor 'transformer.wte.weight' has shape [{HF_VOCAB}, 32], but "),
    ({"vocab_size": 1e12}, "sets vocab_size=1000000000000.0; it must be the whole number of rows"),
    ({"vocab_size": 10 ** 12}, "sets vocab_size=1000000000000; it must be the whole number of rows"),
    ({"n_inner": 64}, "config.json describes [64]: the weights and config.json belong to different models"),
])
def test_hf_weights_must_have_the_shapes_config_json_gives(hf_dir, tmp_path, changes, message):
    source = with_config(hf_dir, tmp_path, **changes)
    for read in (lambda: import_hf(str(source), str(tmp_path / "ckpt"), TargetLayout(1, 1), 32),
                 lambda: examine(str(source))):
        with pytest.raises(InputError) as refusal:
            read()
        assert message in str(refusal.value) and "\n" not in str(refusal.value)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), 0.0])
def test_a_temperature_that_is_not_a_positive_number_is_refused(temperature):
    with pytest.raises(InputError, match=rf"--temperature {temperature} must be a finite number greater than 0"):
        SamplingParams(greedy=False, temperature=temperature)


def test_a_missing_data_prefix_is_named(tmp_path):
    with pytest.raises(InputError, match=rf"{tmp_path}/absent_text_document.idx not found"):
        check_token_ids([str(tmp_path / "absent_text_document")], 256, str(tmp_path / "cache"))


def test_blend_weights_whose_sum_overflows_are_still_relative():
    datasets = [list(range(100)), list(range(100))]
    blend = BlendableDataset(datasets, ["1e308", "1e308"], 50)
    assert blend.weights.tolist() == [0.5, 0.5]
    assert np.bincount(blend.dataset_index).tolist() == [25, 25]
