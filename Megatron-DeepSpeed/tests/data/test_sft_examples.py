"""Rows to examples: upstream's Alpaca rendering and mask rule, prompt/completion, chat rows through the tokenizer's
chat template with only the assistant turns as targets, and each bad row's reason."""
import pytest

from megatron.data.sft_data import renderer_for
from megatron.data.sft_examples import (ALPACA_PROMPT_WITH_INPUT, ALPACA_PROMPT_WITHOUT_INPUT, BadRow,
                                        ExampleRenderer, alpaca_prompt)
from megatron.tokenizer import build_tokenizer
from tests.helpers.sft import write_chat_llama


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer("HFTokenizer", tokenizer_model=write_chat_llama(str(tmp_path_factory.mktemp("llama"))))


def answer_text(tokenizer, example) -> list:
    return [tokenizer.detokenize([token]) for token, target in zip(example.tokens, example.loss_mask) if target]


def test_alpaca_row_is_upstreams_template_with_eos_and_only_the_answer_trained(tokenizer):
    row = {"instruction": "the quick brown fox", "input": "", "output": "jumps over the lazy dog"}
    prompt = ALPACA_PROMPT_WITHOUT_INPUT.format(instruction=row["instruction"])
    assert alpaca_prompt(row) == prompt
    assert alpaca_prompt({**row, "input": "high"}) == ALPACA_PROMPT_WITH_INPUT.format(instruction=row["instruction"],
                                                                                      input="high")
    example = renderer_for(tokenizer)(row)
    whole = tokenizer.tokenize(prompt + row["output"])
    assert example.tokens.tolist() == whole + [tokenizer.eod]
    prompt_length = len(tokenizer.tokenize(prompt))  # upstream's rule: the prompt's own token count
    assert example.loss_mask.tolist() == [0] * prompt_length + [1] * (len(whole) + 1 - prompt_length)
    assert example.tokens[-1] == tokenizer.eod and example.loss_mask[-1] == 1  # the EOS target is kept


def test_prompt_completion_row_trains_on_the_completion_and_eos(tokenizer):
    example = renderer_for(tokenizer)({"prompt": "a llama eats", "completion": " grass"})
    assert "".join(answer_text(tokenizer, example)).replace(" ", "") == "grass</s>"
    assert example.loss_mask[0] == 0


def test_chat_rows_train_on_each_assistant_turn_and_sharegpt_renders_as_messages(tokenizer):
    render = renderer_for(tokenizer)
    messages = [{"role": "system", "content": "quick"}, {"role": "user", "content": "a llama eats"},
                {"role": "assistant", "content": "grass"}, {"role": "user", "content": "the dog"},
                {"role": "assistant", "content": "and the llama"}]
    example = render({"messages": messages})
    chat = tokenizer.chat_template_tokenizer()
    assert example.tokens.tolist() == chat(chat.apply_chat_template(messages, tokenize=False),
                                           add_special_tokens=False)["input_ids"]
    trained = "".join(answer_text(tokenizer, example)).replace(" ", "")
    assert trained == "grass</s>andthellama</s>"  # the assistant turns with their end of turn, nothing else
    sharegpt = [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]}
                for m in messages]
    same = render({"conversations": sharegpt})
    assert same.tokens.tolist() == example.tokens.tolist() and same.loss_mask.tolist() == example.loss_mask.tolist()


@pytest.mark.parametrize("row, reason", [
    ({"instruction": "x"}, "none of the formats"),
    ({"instruction": "x", "output": ""}, "'output' is empty"),
    ({"prompt": "x", "completion": 3}, "'completion' is missing or not a string"),
    ({"messages": []}, "non-empty list"),
    ({"messages": [{"role": "user", "content": "x"}]}, "no assistant turn"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, "ShareGPT roles"),
    (["not", "an", "object"], "must be a JSON object"),
])
def test_a_bad_row_says_why(tokenizer, row, reason):
    with pytest.raises(BadRow, match=reason):
        renderer_for(tokenizer)(row)


def test_a_template_that_renders_turns_differently_in_the_whole_is_a_bad_row(tokenizer):
    class Shifting:
        """Its generation prompt is not a prefix of the rendered turn."""
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "+" * len(messages) + ("?" if add_generation_prompt else "!")

        def __call__(self, text, add_special_tokens):
            return {"input_ids": [ord(c) for c in text]}

    render = ExampleRenderer(tokenizer.tokenize, tokenizer.eod, lambda: Shifting())
    with pytest.raises(BadRow, match="renders the first turns differently"):
        render({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})
