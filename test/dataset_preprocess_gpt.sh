#!/usr/bin/env bash
# JSONL text → Megatron .bin/.idx token files under data/.
#
#   bash test/dataset_preprocess_gpt.sh
#       no arguments: builds the embedded demo corpus (Python's standard-library docstrings, no download),
#       trains a small GPT-2-style BPE vocab on it and writes data/demo_text_document.{bin,idx}
#   bash test/dataset_preprocess_gpt.sh --input=corpus.jsonl --vocab_file=gpt2-vocab.json --merge_file=gpt2-merges.txt
#   bash test/dataset_preprocess_gpt.sh --input=corpus.jsonl --tokenizer_model=spm.model
#       options: --output_prefix=data/NAME (default data/<input name>), --workers=N (default: CPU count),
#       --vocab_size=N (demo vocab, default 4096); anything else (e.g. --split-sentences) goes to
#       tools/preprocess_data.py as it is.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/Megatron-DeepSpeed/tools"

input="" vocab_file="" merge_file="" tokenizer_model="" output_prefix="" vocab_size=4096
workers=$(nproc 2>/dev/null || echo 2)
extra=()
for arg in "$@"; do
  case "$arg" in
    --input=*) input=${arg#*=} ;;
    --vocab_file=*) vocab_file=${arg#*=} ;;
    --merge_file=*) merge_file=${arg#*=} ;;
    --tokenizer_model=*) tokenizer_model=${arg#*=} ;;
    --output_prefix=*) output_prefix=${arg#*=} ;;
    --workers=*) workers=${arg#*=} ;;
    --vocab_size=*) vocab_size=${arg#*=} ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) extra+=("$arg") ;;
  esac
done

python=$(bash "$tools/setup_env.sh")
mkdir -p "$root/data"

if [ -z "$input" ]; then
  input="$root/data/demo_corpus.jsonl"
  tokenizer_dir="$root/data/demo_tokenizer"
  [ -f "$input" ] || "$python" "$tools/build_demo_corpus.py" --output "$input"
  [ -f "$tokenizer_dir/vocab.json" ] || "$python" "$tools/train_bpe_vocab.py" --input "$input" \
    --vocab-size "$vocab_size" --output-dir "$tokenizer_dir"
  vocab_file="$tokenizer_dir/vocab.json" merge_file="$tokenizer_dir/merges.txt"
  output_prefix=${output_prefix:-$root/data/demo}
fi

if [ -n "$tokenizer_model" ]; then
  tokenizer=(--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$tokenizer_model")
elif [ -n "$vocab_file" ] && [ -n "$merge_file" ]; then
  tokenizer=(--tokenizer-type GPT2BPETokenizer --vocab-file "$vocab_file" --merge-file "$merge_file")
else
  echo "error: give --vocab_file=... and --merge_file=... (GPT-2 BPE) or --tokenizer_model=... (SentencePiece)" \
       "with --input; run with no arguments for the demo corpus" >&2
  exit 2
fi
if [ -z "$output_prefix" ]; then
  name=$(basename "$input"); name=${name%.gz}; name=${name%.jsonl}; name=${name%.json}
  output_prefix="$root/data/$name"
fi

"$python" "$tools/preprocess_data.py" --input "$input" --output-prefix "$output_prefix" "${tokenizer[@]}" \
  --append-eod --workers "$workers" ${extra[@]+"${extra[@]}"}
