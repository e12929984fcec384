"""Reading what an offline W&B run wrote, without network and without wandb's own reader (0.31 has none in
Python): its run-<id>.wandb file is a LevelDB-style log (a 7-byte header, then 32 KiB blocks of chunks, each a
7-byte header: CRC32C, length, kind 1 whole / 2 first / 3 middle / 4 last) of wandb's protobuf Records."""
import glob
import json
import os
import struct

BLOCK = 32768
HEADER = 7


def _records(path: str):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    position, parts = HEADER, []
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        if kind == 0:  # the block's zero padding
            position += left
            continue
        parts.append(data[position + HEADER:position + HEADER + length])
        position += HEADER + length
        if kind in (1, 4):
            yield b"".join(parts)
            parts = []


def _key(item) -> str:
    """A history item's tag: W&B keeps one with '/' as its parts (nested_key)."""
    return item.key or "/".join(item.nested_key)


def offline_runs(wandb_dir: str) -> list:
    """The offline run directories under `wandb_dir` (W&B's dir=), oldest first. W&B's service may still be
    writing a finished run's file: it is torn down first (in this process; a later wandb.init starts another)."""
    import wandb

    wandb.teardown()
    return sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*")))


def run_history(run_dir: str) -> tuple:
    """(run id, config dict, history rows without W&B's own _step/_runtime/_timestamp) of one offline run."""
    from wandb.proto import wandb_internal_pb2

    path, = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    run_id, config, rows = None, {}, []
    for raw in _records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            rows.append({_key(item): json.loads(item.value_json) for item in record.history.item
                         if not _key(item).startswith("_")})
    return run_id, config, rows
