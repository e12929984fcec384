"""JSONL → .bin/.idx: Megatron's exact bytes, edge rules, streaming invariance, and bad input."""
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.errors import InputError
from megatron.tokenizer import build_tokenizer
from tests.helpers.paths import TOOLS



def write_jsonl(path, documents):
    with open(path, "w", encoding="utf-8") as handle:
        for document in documents:
            handle.write((document if isinstance(document, str) else json.dumps(document)) + "\n")
    return str(path)


def expected_idx(dtype_code, sizes, itemsize, doc_idx):
    pointers = np.concatenate([[0], np.cumsum(sizes)[:-1] * itemsize]).astype("<i8") if sizes else np.array([], "<i8")
    return (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", dtype_code)
            + struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx))
            + np.array(sizes, "<i4").tobytes() + pointers.tobytes() + np.array(doc_idx, "<i8").tobytes())


def run(tmp_path, documents, vocab_size=100, **options):
    source = write_jsonl(tmp_path / "in.jsonl", documents)
    tokenizer = build_tokenizer("NullTokenizer", vocab_size=vocab_size)
    prefix = str(tmp_path / "out")
    messages = []
    outputs = preprocess(PreprocessOptions(input_pattern=source, output_prefix=prefix, **options), tokenizer,
                         log=messages.append)
    return outputs, messages


def test_document_level_bytes_with_eod_and_an_empty_document(tmp_path):
    # NullTokenizer(100): "1 2 3" -> [1, 2, 3], eod = 100; the empty document adds no item but a doc_idx entry.
    (prefix,), _ = run(tmp_path, [{"text": "1 2 3"}, {"text": ""}, {"text": "7"}], append_eod=True)
    assert prefix == str(tmp_path / "out_text_document")
    with open(prefix + ".idx", "rb") as handle:
        assert handle.read() == expected_idx(8, [4, 2], 2, [0, 1, 1, 2])
    with open(prefix + ".bin", "rb") as handle:
        assert handle.read() == np.array([1, 2, 3, 100, 7, 100], "<u2").tobytes()


def test_without_eod_sizes_exclude_it(tmp_path):
    (prefix,), _ = run(tmp_path, [{"text": "1 2 3"}, {"text": "7"}])
    with open(prefix + ".idx", "rb") as handle:
        assert handle.read() == expected_idx(8, [3, 1], 2, [0, 1, 2])


def test_sentence_level_items_with_eod_on_the_last_sentence(tmp_path):
    # A list value is taken as already-split sentences; the empty sentence is no item.
    (prefix,), _ = run(tmp_path, [{"text": ["1 2", "", "3"]}, {"text": ["4"]}], append_eod=True,
                       split_sentences=True)
    assert prefix.endswith("out_text_sentence")
    dataset = MMapIndexedDataset(prefix)
    assert [list(item) for item in dataset] == [[1, 2], [3, 100], [4, 100]]
    assert list(dataset.doc_idx) == [0, 2, 3]


def test_several_json_keys_write_one_dataset_each(tmp_path):
    outputs, _ = run(tmp_path, [{"text": "1", "title": "5 6"}], json_keys=("text", "title"))
    assert [MMapIndexedDataset(p)[0].tolist() for p in outputs] == [[1], [5, 6]]


def test_large_vocab_uses_int32(tmp_path):
    (prefix,), _ = run(tmp_path, [{"text": "70000 1"}], vocab_size=70000)
    with open(prefix + ".idx", "rb") as handle:
        assert handle.read() == expected_idx(4, [2], 4, [0, 1])


def test_output_does_not_depend_on_workers_or_batching(tmp_path):
    rng = np.random.default_rng(0)
    documents = [{"text": " ".join(map(str, rng.integers(0, 100, rng.integers(0, 30))))} for _ in range(500)]
    reference, _ = run(tmp_path, documents, append_eod=True)
    reference_bytes = [open(reference[0] + suffix, "rb").read() for suffix in (".bin", ".idx")]
    for workers, batch_bytes in ((1, 64), (3, 300), (2, 1 << 20)):
        os.remove(reference[0] + ".bin"), os.remove(reference[0] + ".idx")
        outputs, _ = run(tmp_path, documents, append_eod=True, workers=workers, batch_bytes=batch_bytes)
        assert [open(outputs[0] + suffix, "rb").read() for suffix in (".bin", ".idx")] == reference_bytes


def test_glob_and_gzip_inputs_are_concatenated_in_sorted_order(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "1"}, {"text": "2 3"}])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"text": "4"}) + "\n")
    tokenizer = build_tokenizer("NullTokenizer", vocab_size=10)
    (prefix,) = preprocess(PreprocessOptions(input_pattern=str(tmp_path / "*.jsonl*"),
                                             output_prefix=str(tmp_path / "out")), tokenizer, log=lambda _: None)
    assert [item.tolist() for item in MMapIndexedDataset(prefix)] == [[1], [2, 3], [4]]


def test_progress_reports_documents_and_throughput(tmp_path):
    _, messages = run(tmp_path, [{"text": "1"}] * 5, log_interval=2, batch_bytes=1)
    assert sum("Processed" in line for line in messages) == 2
    assert all("docs/s" in line and "MB/s" in line for line in messages if "Processed" in line)


def test_gpt2_tokens_match_the_reference_encoder(tmp_path):
    from megatron.data.demo_corpus import iter_stdlib_docstrings
    from megatron.tokenizer.bpe_training import train_bpe_vocab
    from tests.helpers.gpt2_reference_bpe import ReferenceGPT2Encoder

    texts = [text for _, text in zip(range(120), iter_stdlib_docstrings())] + ["", "<|endoftext|> literal"]
    vocab, merges = train_bpe_vocab(texts, 600, tmp_path / "bpe")
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": text} for text in texts])
    tokenizer = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    (prefix,) = preprocess(PreprocessOptions(input_pattern=source, output_prefix=str(tmp_path / "out"),
                                             append_eod=True, workers=2), tokenizer, log=lambda _: None)
    reference = ReferenceGPT2Encoder(vocab, merges)
    expected = [reference.encode(text) + [tokenizer.eod] for text in texts if reference.encode(text)]
    assert [item.tolist() for item in MMapIndexedDataset(prefix)] == expected


def assert_no_output(tmp_path):
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("out")) == []


def test_malformed_json_names_file_and_line_and_leaves_no_output(tmp_path):
    with pytest.raises(InputError, match=r"in\.jsonl:3: not a valid JSON object.*--skip-malformed-lines"):
        run(tmp_path, [{"text": "1"}, {"text": "2"}, '{"text": "3"', {"text": "4"}])
    assert_no_output(tmp_path)


def test_malformed_lines_can_be_skipped_and_are_counted(tmp_path):
    (prefix,), messages = run(tmp_path, [{"text": "1"}, "not json", "[1, 2]", {"text": "4"}],
                              skip_malformed_lines=True)
    assert [item.tolist() for item in MMapIndexedDataset(prefix)] == [[1], [4]]
    assert any("Skipped 2 malformed lines" in line for line in messages)


def test_missing_key_names_line_and_the_flag(tmp_path):
    with pytest.raises(InputError, match=r"in\.jsonl:2: the JSON object has no key 'text' \(its keys: 'body'\).*--json-keys"):
        run(tmp_path, [{"text": "1"}, {"body": "2"}])
    assert_no_output(tmp_path)


def test_non_string_value_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"in\.jsonl:1: key 'text' holds a int"):
        run(tmp_path, [{"text": 5}])


def test_missing_input_is_reported(tmp_path):
    tokenizer = build_tokenizer("NullTokenizer", vocab_size=10)
    with pytest.raises(InputError, match=r"--input .*nothing\.jsonl.* does not exist"):
        preprocess(PreprocessOptions(input_pattern=str(tmp_path / "nothing.jsonl"),
                                     output_prefix=str(tmp_path / "out")), tokenizer)
    with pytest.raises(InputError, match="matches no file"):
        preprocess(PreprocessOptions(input_pattern=str(tmp_path / "*.jsonl"),
                                     output_prefix=str(tmp_path / "out")), tokenizer)


def test_ids_that_do_not_fit_the_dtype_are_refused(tmp_path):
    # vocab 1000 -> uint16, but the text holds id 70000
    with pytest.raises(InputError, match="70000"):
        run(tmp_path, [{"text": "1"}, {"text": "70000"}], vocab_size=1000)
    assert_no_output(tmp_path)


def test_unwritable_output_directory(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1"}])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InputError):
        preprocess(PreprocessOptions(input_pattern=source, output_prefix=str(blocker / "out")),
                   build_tokenizer("NullTokenizer", vocab_size=10))


def test_cli_reports_errors_without_traceback(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1"}, "{broken"])
    result = subprocess.run([sys.executable, os.path.join(TOOLS, "preprocess_data.py"), "--input", source,
                             "--output-prefix", str(tmp_path / "out"), "--tokenizer-type", "NullTokenizer",
                             "--vocab-size", "10"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "in.jsonl:2" in result.stderr and "Traceback" not in result.stderr
    assert_no_output(tmp_path)


def test_cli_writes_megatron_names(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1 2"}])
    result = subprocess.run([sys.executable, os.path.join(TOOLS, "preprocess_data.py"), "--input", source,
                             "--output-prefix", str(tmp_path / "out"), "--tokenizer-type", "NullTokenizer",
                             "--vocab-size", "10", "--append-eod", "--workers", "2"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert MMapIndexedDataset(str(tmp_path / "out_text_document"))[0].tolist() == [1, 2, 10]
