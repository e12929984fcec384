"""This project's checkpoints as an lm-evaluation-harness model ("megatron_gpt"), so `lm_eval`'s tasks (MMLU,
HellaSwag, ARC, ...) score a checkpoint directly, without a Hugging Face export.

A checkpoint of any layout (TP x PP x DP, any ZeRO stage) is joined into one process while it loads
(inference/loading.py reads each weight's shards and puts them together), and the tokenizer is the one the run
recorded (GPT-2 BPE, SentencePiece or HFTokenizer; any tokenizer flag may be given to override it). Requests are
tokenized by lm-eval's own TemplateLM rules (a trailing space of the context moves to the continuation, an empty
context becomes the end-of-document token), and are scored as its `hf` model scores them: the last max_length
tokens of context + continuation, log-softmax over the tokenizer's vocabulary (padding rows dropped), the
continuation's log-probabilities summed, greedy when every continuation token is the argmax.
`generate_until` decodes with the KV-cache generator (inference/generation.py), greedy unless do_sample.
Imported only where lm-eval is installed (tools/evaluate_harness.py, the tests): an optional dependency.
"""
from typing import List, Optional, Sequence

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from megatron import device
from megatron.config.recorded_flags import RecordedFlags
from megatron.errors import InputError
from megatron.inference.distributed import generate_for_prompts
from megatron.inference.generation import full_vocabulary_logits
from megatron.inference.loading import TOKENIZER_FLAGS, build_checkpoint_tokenizer, load_model, recorded_flags
from megatron.inference.sampling import SamplingParams
from megatron.model.kernels import select_kernels

MODEL_NAME = "megatron_gpt"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's hf model's
# lm_eval hands every model these; the device is megatron.device's choice, the batch size is batch_size's
LM_EVAL_OPTIONS = ("max_batch_size", "device")


def _whole_number(name: str, value, least: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = least - 1
    if number < least:
        raise InputError(f"--model_args {name}={value}: give a whole number of {least} or more")
    return number


@register_model(MODEL_NAME)
class MegatronGPT(TemplateLM):
    """--model megatron_gpt --model_args load=DIR[,iteration=N][,dtype=float32|bfloat16|float16]
    [,max_gen_toks=N][,tokenizer_type=...,vocab_file=...,merge_file=...,tokenizer_model=...,vocab_size=...];
    lm_eval's --batch_size sets the requests per forward pass."""

    def __init__(self, load: Optional[str] = None, iteration=None, dtype: str = "float32", batch_size=1,
                 max_gen_toks=DEFAULT_MAX_GEN_TOKS, seed=1234, **options):
        super().__init__()
        tokenizer_flags = {name: value for name, value in options.items() if name not in LM_EVAL_OPTIONS}
        unknown = sorted(set(tokenizer_flags) - set(TOKENIZER_FLAGS))
        if unknown:
            raise InputError(f"--model_args {','.join(unknown)}: not an argument of {MODEL_NAME}; it takes load, "
                             f"iteration, dtype, max_gen_toks, seed and {', '.join(TOKENIZER_FLAGS)}")
        if not load:
            raise InputError(f"--model {MODEL_NAME} needs --model_args load=DIR (a checkpoint directory: the --save "
                             "of a training run, or a converted one)")
        if dtype not in DTYPES:
            raise InputError(f"--model_args dtype={dtype}: choose one of {', '.join(DTYPES)}")
        iteration = None if iteration is None else _whole_number("iteration", iteration, least=0)
        self.batch_size = _whole_number("batch_size", batch_size)
        self.max_gen_toks = _whole_number("max_gen_toks", max_gen_toks)
        self.seed = _whole_number("seed", seed, least=0)
        recorded = recorded_flags(load, iteration)
        self.tokenizer = build_checkpoint_tokenizer(tokenizer_flags, recorded)
        self.model, _ = load_model(load, tokenizer_vocab_size=self.tokenizer.vocab_size, parallel_state=None,
                                   kernels=select_kernels(device.device_name(), training=False),
                                   dtype=DTYPES[dtype], device=device.current_device(), iteration=iteration)
        self.max_length = RecordedFlags.of(recorded).max_position_embeddings

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eod

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and the first rolling window condition on: as lm-eval's hf model, the BOS token
        where the tokenizer has one (HFTokenizer's bos_token), else the end of document."""
        bos = getattr(self.tokenizer, "bos", None)  # only HFTokenizer names one
        return self.eot_token_id if bos is None else bos

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> List[int]:
        """The tokenizer's ids, as training saw the text (special tokens as its post-processor adds them, e.g.
        Llama's BOS, which lm-eval's hf model adds only with add_bos_token=True)."""
        return list(self.tokenizer.tokenize(string))

    def _batches(self, count: int, length) -> List[List[int]]:
        """Indices 0..count-1 in batches of batch_size, longest first (each batch's padding small)."""
        order = sorted(range(count), key=lambda index: -length(index))
        return [order[first:first + self.batch_size] for first in range(0, count, self.batch_size)]

    @torch.no_grad()
    def _log_probabilities(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """fp32 log-softmax over the tokenizer's vocabulary at each position of the rows, right-padded."""
        tokens = torch.full((len(rows), max(map(len, rows))), self.eot_token_id, dtype=torch.long)
        for row, ids in enumerate(rows):
            tokens[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        logits = self.model(tokens.to(self.model.device))
        return full_vocabulary_logits(logits, None, self.tokenizer.vocab_size).float().log_softmax(dim=-1).cpu()

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> List[tuple]:
        """(sum of the continuation's log-probabilities, whether it is the greedy choice) of each
        ((context, continuation) or None, context ids, continuation ids)."""
        results: List[Optional[tuple]] = [None] * len(requests)
        for indices in self._batches(len(requests), lambda i: len(requests[i][1]) + len(requests[i][2])):
            inputs = [(requests[i][1] + requests[i][2])[-(self.max_length + 1):][:-1] for i in indices]
            log_probabilities = self._log_probabilities(inputs)
            for row, index in enumerate(indices):
                key, _, continuation = requests[index]
                end = len(inputs[row])
                scores = log_probabilities[row, end - len(continuation):end]
                target = torch.tensor(continuation, dtype=torch.long)
                answer = (float(scores.gather(1, target.unsqueeze(1)).sum()),
                          bool((scores.argmax(-1) == target).all()))
                results[index] = answer
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
        """Each text's log-likelihood in disjoint windows of max_length tokens, each conditioned on the token
        before it (lm-eval's windows: the first on prefix_token_id)."""
        windows, owners = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (log_probability, _) in zip(owners, self._loglikelihood_tokens(windows)):
            totals[owner] += log_probability
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
        """Each context's continuation, cut before the first stop sequence (and the end of document), requests
        with the same settings decoded together in batches."""
        eos = self.tokenizer.detokenize([self.eot_token_id])
        groups: dict = {}
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            settings = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = handle_stop_sequences(settings.pop("until", None), eos=eos)
            key = (settings["max_gen_toks"], bool(settings["do_sample"]), float(settings["temperature"]))
            groups.setdefault(key, []).append((index, context, until))
        results: List[Optional[str]] = [None] * len(requests)
        for (max_gen_toks, do_sample, temperature), members in groups.items():
            if max_gen_toks >= self.max_length:
                raise InputError(f"max_gen_toks {max_gen_toks} leaves no room for a context in the model's "
                                 f"{self.max_length} positions; give a smaller max_gen_toks")
            prompts = [self.tok_encode(context)[-(self.max_length - max_gen_toks):] for _, context, _ in members]
            params = SamplingParams(greedy=not do_sample, temperature=temperature if temperature > 0 else 1.0,
                                    seed=self.seed)
            generated = generate_for_prompts(self.model, prompts, batch_size=self.batch_size,
                                             max_new_tokens=max_gen_toks, params=params, eod=self.eot_token_id,
                                             vocab_size=self.tokenizer.vocab_size)
            for (index, context, until), result in zip(members, generated):
                ids = [token for token in result.generated_ids if token != self.eot_token_id]
                text = postprocess_generated_text(self.tokenizer.detokenize(ids), until, None)
                results[index] = text
                self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return results
