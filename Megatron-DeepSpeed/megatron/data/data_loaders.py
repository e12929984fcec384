"""Train / validation / test data loaders from the flags: Megatron-format files, or synthetic tokens."""
from torch.utils.data import DataLoader

from megatron.data.gpt_batch import collate
from megatron.data.gpt_dataset import build_train_valid_test_datasets
from megatron.data.mock_dataset import MockGPTDataset
from megatron.data.samplers import MegatronPretrainingSampler


def train_valid_test_num_samples(args) -> list[int]:
    """Samples each split must provide over the whole run (Megatron's arithmetic)."""
    train_iters = args.train_iters if args.train_iters else args.train_samples // args.global_batch_size
    train_samples = args.train_samples or args.train_iters * args.global_batch_size
    evaluations = train_iters // args.eval_interval + 1
    return [train_samples, evaluations * args.eval_iters * args.global_batch_size,
            args.eval_iters * args.global_batch_size]


def build_datasets(args, vocab_size: int):
    """(train, valid, test); a split is None when it is empty or unused."""
    num_samples = train_valid_test_num_samples(args)
    if args.mock_data:
        return tuple(MockGPTDataset(count, args.seq_length, vocab_size, args.seed + split) if count else None
                     for split, count in enumerate(num_samples))
    return build_train_valid_test_datasets(args.data_path, args.split, num_samples, args.seq_length, args.seed,
                                           data_cache_path=args.data_cache_path)


def build_data_loader(dataset, consumed_samples: int, args, data_parallel_rank: int, data_parallel_size: int):
    """Micro-batches for this data-parallel rank, starting after `consumed_samples` (resume-safe)."""
    if dataset is None:
        return None
    sampler = MegatronPretrainingSampler(total_samples=len(dataset), consumed_samples=consumed_samples,
                                         micro_batch_size=args.micro_batch_size,
                                         data_parallel_rank=data_parallel_rank,
                                         data_parallel_size=data_parallel_size)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers, collate_fn=collate,
                      persistent_workers=args.num_workers > 0)
