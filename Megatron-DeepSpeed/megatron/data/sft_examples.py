"""Fine-tuning examples as token ids with a loss mask: which formats a row may have and how each is rendered.

A row is one of: upstream's Alpaca record (`instruction`, `input`, `output`), rendered with the Alpaca prompt
template and the end-of-sequence token after the output, as upstream main's prompt_dataset.py renders it (it appends
the EOS text, which its Hugging Face tokenizer encodes as that token; the id is appended here, so tokenizers that
read the text as plain text, as GPT-2's does, end the same way); a plain `prompt` / `completion` record (the
completion and the EOS token are the answer); a chat record, `messages`
(`role`, `content`) or ShareGPT's `conversations` (`from`, `value`), rendered with the tokenizer's own chat
template (transformers' apply_chat_template on the checkpoint's tokenizer_config.json), every assistant turn
an answer. The mask is 1 on answer tokens (the loss's targets) and 0 on prompts; a row that cannot be rendered
raises BadRow with the reason, which the caller reports with the row's place.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
ALPACA_PROMPT_WITHOUT_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


class BadRow(ValueError):
    """A row that cannot become an example; the message says why."""


@dataclass(frozen=True)
class Example:
    """Token ids and a same-length 0/1 mask: 1 where the token is a target of the loss. The first token is never
    one (nothing before it in the example predicts it)."""
    tokens: np.ndarray
    loss_mask: np.ndarray

    @staticmethod
    def of(tokens, answer: np.ndarray) -> "Example":
        mask = np.asarray(answer, dtype=np.uint8).copy()
        mask[:1] = 0
        return Example(np.asarray(tokens, dtype=np.int64), mask)

    def __len__(self) -> int:
        return len(self.tokens)


def row_format(row) -> str:
    """Which format `row` has ("alpaca", "prompt/completion", "messages", "conversations"), by its keys."""
    if not isinstance(row, dict):
        raise BadRow(f"a row must be a JSON object, not {type(row).__name__}")
    for keys, name in ((("messages",), "messages"), (("conversations",), "conversations"),
                       (("instruction", "output"), "alpaca"), (("prompt", "completion"), "prompt/completion")):
        if all(key in row for key in keys):
            return name
    raise BadRow(f"has keys {sorted(row)}, none of the formats: alpaca (instruction, input, output), "
                 "prompt/completion, messages (role, content), conversations (from, value)")


class ExampleRenderer:
    """Rows to Examples with one tokenizer: `tokenize(text) -> ids` as the training tokenizer encodes a text
    (special tokens included, e.g. Llama's BOS), `eos` the end-of-sequence id, and
    `chat_template_tokenizer` a transformers tokenizer, asked for only when a chat row comes."""

    def __init__(self, tokenize: Callable[[str], list], eos: int,
                 chat_template_tokenizer: Optional[Callable[[], object]] = None):
        self.tokenize, self.eos = tokenize, eos
        self._chat_tokenizer_factory, self._chat_tokenizer = chat_template_tokenizer, None

    def __call__(self, row) -> Example:
        kind = row_format(row)
        if kind == "alpaca":
            return self.prompt_and_answer(alpaca_prompt(row), _text(row, "output"))
        if kind == "prompt/completion":
            return self.prompt_and_answer(_text(row, "prompt", empty=True), _text(row, "completion"))
        return self.chat(chat_messages(row, kind))

    def prompt_and_answer(self, prompt: str, answer: str) -> Example:
        """Upstream's rule: the whole text (prompt and answer) tokenized and EOS appended, its first as many tokens
        as the prompt alone tokenizes to left out of the loss."""
        tokens = list(self.tokenize(prompt + answer)) + [self.eos]
        prompt_length = len(self.tokenize(prompt))
        if prompt_length >= len(tokens):
            raise BadRow("the answer adds no token after the prompt")
        return Example.of(tokens, np.arange(len(tokens)) >= prompt_length)

    def chat(self, messages: list) -> Example:
        """The conversation through the chat template; each assistant turn's tokens (what the template writes
        for it after the generation prompt, its end-of-turn text included) are answers. Needs a template whose
        rendering of the first turns is a prefix of the whole rendering, as chat templates are made."""
        tokenizer = self.chat_tokenizer()
        whole = self._chat_ids(tokenizer, messages, False)
        answer = np.zeros(len(whole), dtype=bool)
        for turn, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._chat_ids(tokenizer, messages[:turn], True)
            through_turn = self._chat_ids(tokenizer, messages[:turn + 1], False)
            start, end = len(before), len(through_turn)
            if whole[:end] != through_turn or through_turn[:start] != before:
                raise BadRow("the chat template renders the first turns differently within the whole "
                             "conversation, so the assistant turns cannot be located")
            answer[start:end] = True
        if not answer[1:].any():
            raise BadRow("no assistant turn with content")
        return Example.of(whole, answer)

    def chat_tokenizer(self):
        if self._chat_tokenizer is None:
            if self._chat_tokenizer_factory is None:
                raise BadRow("a chat row needs a tokenizer with a chat template (--tokenizer-type HFTokenizer)")
            self._chat_tokenizer = self._chat_tokenizer_factory()
        return self._chat_tokenizer

    @staticmethod
    def _chat_ids(tokenizer, messages: list, generation_prompt: bool) -> list:
        if not messages:
            return []
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        except Exception as err:  # jinja2's TemplateError, or a template's raise_exception
            raise BadRow(f"the chat template refuses it ({err})") from None
        return tokenizer(text, add_special_tokens=False)["input_ids"]


def alpaca_prompt(row: dict) -> str:
    """Upstream's choice of template: with the input when it is a non-empty string."""
    fields = {"instruction": _text(row, "instruction"), "input": row.get("input", "")}
    if fields["input"] and not isinstance(fields["input"], str):
        raise BadRow(f"'input' is a {type(fields['input']).__name__}, not a string")
    template = ALPACA_PROMPT_WITH_INPUT if fields["input"] else ALPACA_PROMPT_WITHOUT_INPUT
    return template.format_map(fields)


def chat_messages(row: dict, kind: str) -> list:
    """The row's turns as [{"role", "content"}]; ShareGPT's `from` / `value` mapped to roles."""
    turns = row[kind]
    if not isinstance(turns, list) or not turns:
        raise BadRow(f"'{kind}' must be a non-empty list of turns")
    role_key, content_key = ("role", "content") if kind == "messages" else ("from", "value")
    messages = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_key not in turn or not isinstance(turn.get(content_key), str):
            raise BadRow(f"turn {index} of '{kind}' needs '{role_key}' and a string '{content_key}'")
        role = turn[role_key] if kind == "messages" else SHAREGPT_ROLES.get(turn[role_key])
        if role is None:
            raise BadRow(f"turn {index} has 'from' {turn[role_key]!r}; ShareGPT roles are "
                         f"{', '.join(SHAREGPT_ROLES)}")
        messages.append({"role": role, "content": turn[content_key]})
    if not any(message["role"] == "assistant" and message["content"] for message in messages):
        raise BadRow(f"'{kind}' has no assistant turn with content: nothing to train on")
    return messages


def _text(row: dict, key: str, empty: bool = False) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise BadRow(f"'{key}' is missing or not a string")
    if not value and not empty:
        raise BadRow(f"'{key}' is empty: nothing to train on")
    return value
