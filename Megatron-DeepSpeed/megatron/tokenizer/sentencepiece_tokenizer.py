"""SentencePiece models (--tokenizer-model), as Megatron's GPTSentencePieceTokenizer uses them: plain
encode/decode of ids, end of document = the model's end-of-sentence piece."""
import sentencepiece

from megatron.errors import InputError
from megatron.tokenizer import pack_token_arrays, read_user_file, replace_lone_surrogates


class SentencePieceTokenizer:
    def __init__(self, model_file):
        self._processor = sentencepiece.SentencePieceProcessor()
        try:
            self._processor.LoadFromSerializedProto(read_user_file(model_file, "--tokenizer-model"))
        except RuntimeError as err:
            raise InputError(f"--tokenizer-model {model_file}: not a usable SentencePiece model ({err}); "
                             f"pass a .model file written by the SentencePiece trainer") from None
        if self._processor.eos_id() < 0:
            raise InputError(f"--tokenizer-model {model_file}: the model has no end-of-sentence piece "
                             f"(eos_id is -1), which serves as the end-of-document id; retrain it with eos_id set")
        self.vocab_size = self._processor.get_piece_size()
        self.eod = self._processor.eos_id()

    def tokenize(self, text):
        return self.tokenize_batch([text])[0].tolist()

    def tokenize_batch(self, texts):
        """(ids of all texts concatenated, int64 length per text). Thread-safe; SentencePiece encodes with
        the GIL released. One engine thread per call: parallelism comes from the calling threads."""
        texts = list(texts)
        try:
            arrays = self._encode(texts)
        except TypeError:  # SentencePiece's complaint about a text that is not valid UTF-8
            arrays = self._encode([replace_lone_surrogates(text) for text in texts])
        return pack_token_arrays(arrays)

    def detokenize(self, ids):
        return self._processor.decode([int(i) for i in ids])

    def _encode(self, texts):
        return self._processor.encode(texts, return_type="numpy", num_threads=1)
