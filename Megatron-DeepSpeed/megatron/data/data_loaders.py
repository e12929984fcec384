"""Train / validation / test data loaders from the job configuration: Megatron-format files, or synthetic tokens."""
import signal

import torch
from torch.utils.data import DataLoader

from megatron.config.job import JobConfig
from megatron.data.gpt_batch import BatchMaker, collate
from megatron.data.gpt_dataset import build_train_valid_test_datasets, parse_data_prefix
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.mock_dataset import MockGPTDataset
from megatron.data.samplers import MegatronPretrainingRandomSampler, MegatronPretrainingSampler
from megatron.data.token_range import check_token_ids
from megatron.errors import InputError

SAMPLERS = {"single": MegatronPretrainingSampler, "cyclic": MegatronPretrainingRandomSampler}


def train_valid_test_num_samples(config: JobConfig) -> list[int]:
    """Samples each split must provide over the whole run (Megatron's arithmetic)."""
    global_batch_size, eval_iters = config.batch.global_batch_size, config.logging.eval_iters
    train_iters = config.schedule.total_iterations(config.batch)
    evaluations = train_iters // config.logging.eval_interval + 1
    return [config.schedule.total_samples(global_batch_size), evaluations * eval_iters * global_batch_size,
            eval_iters * global_batch_size]


class PretrainingData:
    """pretrain_gpt.py's data, as training/loop.py asks for it (data/sft_data.py has fine-tuning's)."""

    def datasets(self, config: JobConfig, tokenizer, vocab_size: int) -> tuple:
        if config.data.pack_sequences:
            raise InputError("--pack-sequences packs fine-tuning examples (finetune_llama.py); pre-training samples "
                             "are documents back to back already (--reset-attention-mask keeps them apart)")
        return build_datasets(config, vocab_size)

    def batch_maker(self, config: JobConfig, tokenizer, sequence_chunk: tuple) -> BatchMaker:
        data = config.data
        return BatchMaker(tokenizer.eod, reset_position_ids=data.reset_position_ids,
                          reset_attention_mask=data.reset_attention_mask, eod_mask_loss=data.eod_mask_loss,
                          sequence_chunk=sequence_chunk)


def build_datasets(config: JobConfig, vocab_size: int):
    """(train, valid, test); a split is None when it is empty or unused. The data's token ids are checked
    against `vocab_size` (the padded vocabulary) first, and an empty train split is an error."""
    num_samples, data = train_valid_test_num_samples(config), config.data
    if data.mock_data:
        return tuple(MockGPTDataset(count, data.seq_length, vocab_size, data.seed + split) if count else None
                     for split, count in enumerate(num_samples))
    if data.split_data_paths:
        return _separate_split_datasets(data, num_samples, vocab_size)
    prefixes, _ = parse_data_prefix(list(data.data_path))
    check_token_ids(prefixes, vocab_size, data.data_cache_path)
    datasets = build_train_valid_test_datasets(list(data.data_path), data.split, num_samples, data.seq_length,
                                               data.seed, data_cache_path=data.data_cache_path)
    if datasets[0] is None:
        items = ", ".join(f"{prefix} has {len(MMapIndexedDataset(prefix))} items" for prefix in prefixes)
        raise InputError(f"--data-path: the train split is empty ({items}; --split {data.split!r}): give train a "
                         f"share of --split, or re-create the data from input that is not empty")
    return datasets


def _separate_split_datasets(data, num_samples: list, vocab_size: int):
    """Upstream main's --train/valid/test-data-path: each split from its own data, all of its documents (a split
    string giving that split everything); a split without data is None."""
    datasets = []
    for split, path in enumerate(data.split_data_paths):
        if not path or not num_samples[split]:
            datasets.append(None)
            continue
        check_token_ids(parse_data_prefix(list(path))[0], vocab_size, data.data_cache_path)
        whole = ",".join("100" if index == split else "0" for index in range(3))
        counts = [count if index == split else 0 for index, count in enumerate(num_samples)]
        datasets.append(build_train_valid_test_datasets(list(path), whole, counts, data.seq_length, data.seed,
                                                        data_cache_path=data.data_cache_path)[split])
    if datasets[0] is None:
        raise InputError(f"--train-data-path {' '.join(data.split_data_paths[0])}: the train data is empty; "
                         "re-create it from input that is not empty")
    return tuple(datasets)


def build_data_loader(dataset, consumed_samples: int, *, micro_batch_size: int, num_workers: int,
                      data_parallel_rank: int, data_parallel_size: int, dataloader_type: str = "single",
                      collate_fn=collate):
    """Micro-batches for this data-parallel rank, starting after `consumed_samples` (resume-safe), in the
    order of --dataloader-type (single: one pass; cyclic: a new random order per epoch, each time the loader
    is iterated again), each as `collate_fn` makes it of its samples (by default one token tensor)."""
    if dataset is None:
        return None
    sampler = SAMPLERS[dataloader_type](total_samples=len(dataset), consumed_samples=consumed_samples,
                                        micro_batch_size=micro_batch_size, data_parallel_rank=data_parallel_rank,
                                        data_parallel_size=data_parallel_size)
    # A generator of its own: each iterator draws its workers' base seed from it. From torch's global stream it
    # would shift the draws of dropout and of the MoE gates, which a resumed run restores before its loaders exist.
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_fn,
                      persistent_workers=num_workers > 0, worker_init_fn=_outlive_sigterm, generator=torch.Generator())


def _outlive_sigterm(worker_id: int) -> None:
    """A loader worker ignores SIGTERM, which torchrun and batch schedulers send to every process of a rank:
    its rank decides what SIGTERM means (--exit-signal-handler: finish the iteration and save, which needs the
    workers), and a worker ends with its rank anyway (torch's DataLoader watches the parent)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
