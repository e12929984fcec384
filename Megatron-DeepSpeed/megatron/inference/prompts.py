"""Prompts from the command line or a file, checked and tokenized before any model work starts."""
import json
from typing import List, Optional, Sequence

from megatron.errors import InputError
from megatron.files.user_json import read_text_lines


def read_prompt_file(path: str) -> List[str]:
    """Prompts of a file: JSONL with a "text" field per line (when its first non-blank line is a JSON object),
    else one prompt per line. Blank lines are skipped."""
    lines = read_text_lines(path, f"--prompt-file {path}", "give a text or JSONL file")
    numbered = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise InputError(f"--prompt-file {path} contains no prompts; write one prompt per line, or JSONL lines "
                         'like {"text": "..."}')
    if not numbered[0][1].lstrip().startswith("{"):
        return [line for _, line in numbered]
    prompts = []
    for number, line in numbered:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"--prompt-file {path}, line {number}: not valid JSON ({err.msg}); every line of a "
                             'JSONL prompt file must be an object like {"text": "..."}') from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f'--prompt-file {path}, line {number}: needs a string field "text", e.g. '
                             '{"text": "Once upon a time"}')
        prompts.append(record["text"])
    return prompts


def gather_prompts(prompts: Sequence[str], prompt_file: Optional[str]) -> List[str]:
    """The --prompt values, then those of --prompt-file."""
    texts = list(prompts) + (read_prompt_file(prompt_file) if prompt_file else [])
    if not texts:
        raise InputError("no prompt given; pass --prompt TEXT (repeatable) or --prompt-file FILE")
    return texts


def tokenize_prompts(tokenizer, texts: Sequence[str], max_new_tokens: int, max_positions: int) -> List[List[int]]:
    """Token ids of each prompt; InputError for a prompt that tokenizes to nothing or leaves no room for
    max_new_tokens within the model's max_positions."""
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens} must be at least 1")
    token_lists = []
    for number, text in enumerate(texts, start=1):
        ids = list(tokenizer.tokenize(text))
        if not ids:
            raise InputError(f"prompt {number} ({text!r}) is empty after tokenization; give it some text")
        if len(ids) + max_new_tokens > max_positions:
            raise InputError(f"prompt {number} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} that "
                             f"is longer than the model's context of {max_positions} positions "
                             f"(--max-position-embeddings); shorten the prompt or lower --max-new-tokens")
        token_lists.append(ids)
    return token_lists
