"""Prompt lines: "prompt" text, "prompt_ids" or chat "messages"; each malformed line is one error naming the file
and line; messages (and, in chat mode, text) go through the tokenizer's chat template; a missing template or
tokenizer is an error naming the line."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.assets_path import bundled_model_dir
from fastrl.commands.prompt_tokens import line_token_ids
from fastrl.commands.prompts_io import read_prompts
from fastrl.models.tokenizer import chat_token_ids, load_tokenizer
from tests.helpers import chat_tokenizer


def _write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_messages_lines_are_read_with_their_seed(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    path = _write(tmp_path / "p.jsonl", [{"messages": chat, "seed": 4}, {"prompt": "x"}, {"prompt_ids": [3]}])
    lines = read_prompts(path)
    assert lines[0].messages == chat and lines[0].seed == 4 and lines[0].prompt is None
    assert lines[1].messages is None and lines[2].prompt_ids == [3]


@pytest.mark.parametrize(
    "line, message",
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": "hi"}, "non-empty list"),
        ({"messages": ["hi"]}, r'"messages"\[0\] must be an object'),
        ({"messages": [{"role": "user"}]}, r'"messages"\[0\].content must be a string'),
        ({"messages": [{"role": "user", "content": "a"}, {"role": 3, "content": "b"}]}, r"\[1\].role"),
        ({"messages": [{"role": "user", "content": "a"}], "prompt": "b"}, "exactly one of"),
        ({"prompt_ids": [1], "prompt": "b"}, "exactly one of"),
        ({"seed": 3}, "exactly one of"),
        ({"prompt": None}, '"prompt" must be a string, got None'),
        ({"prompt": 3}, '"prompt" must be a string, got 3'),
        ({"prompt_ids": None}, '"prompt_ids" must be a list of integers'),
    ],
)
def test_a_malformed_line_names_its_file_and_line(tmp_path, line, message):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "ok"}, line])
    with pytest.raises(ValueError, match=message) as err:
        read_prompts(path)
    assert f"{path}:2" in str(err.value)


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text("abcxyz 0123+=?", max_size=12)),
        min_size=1,
        max_size=4,
    ),
    text=st.text("abc 12+=", min_size=1, max_size=10),
)
def test_messages_and_chat_text_go_through_the_template(tmp_path_factory, turns, text):
    tokenizer = chat_tokenizer()
    messages = [{"role": r, "content": c} for r, c in turns]
    path = _write(tmp_path_factory.mktemp("p") / "p.jsonl", [{"messages": messages}, {"prompt": text}])
    chat_line, text_line = read_prompts(path)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert line_token_ids(chat_line, tokenizer, False, "w") == list(expected["input_ids"])
    assert line_token_ids(chat_line, tokenizer, True, "w") == list(expected["input_ids"])
    as_user = chat_token_ids(tokenizer, [{"role": "user", "content": text}])
    assert line_token_ids(text_line, tokenizer, True, "w") == as_user
    assert line_token_ids(text_line, tokenizer, False, "w") == list(tokenizer(text)["input_ids"]) != as_user
    assert tokenizer.decode(as_user).endswith(f"user: {text}\nassistant: ")


def test_a_template_or_tokenizer_the_model_lacks_is_named(tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"messages": [{"role": "user", "content": "a"}]}, {"prompt": "b"}])
    chat_line, text_line = read_prompts(path)
    plain = load_tokenizer(bundled_model_dir())
    with pytest.raises(ValueError, match=r'p.jsonl:1: "messages" needs a chat template, and the tokenizer of M'):
        line_token_ids(chat_line, plain, False, f"{path}:1", "M")
    with pytest.raises(ValueError, match=r"p.jsonl:2: chat_template=true needs a chat template"):
        line_token_ids(text_line, plain, True, f"{path}:2", "M")
    with pytest.raises(ValueError, match=r'"messages" needs a tokenizer, and M has none'):
        line_token_ids(chat_line, None, False, f"{path}:1", "M")


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{% if m['role'] not in ['user', 'system'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{{ m['content'] }}{% endfor %}",
        "{% for m in messages %}{{ m['content'] + m['name'] }}{% endfor %}",  # a key the line lacks
    ],
)
def test_a_chat_template_refusing_a_line_is_an_error_naming_the_line(tmp_path, template):
    tokenizer = chat_tokenizer()
    tokenizer.chat_template = template
    line = read_prompts(_write(tmp_path / "p.jsonl", [{"messages": [{"role": "tool", "content": "hi"}]}]))[0]
    with pytest.raises(ValueError, match=r"^p\.jsonl:1: the chat template of m refused this line: "):
        line_token_ids(line, tokenizer, chat=False, where="p.jsonl:1", model="m")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('{"prompt": "a\\ud800b"}', "\"prompt\" holds a lone surrogate ('\\ud800' at character 1)"),
        ('{"messages": [{"role": "user", "content": "x\\udc00"}]}', '"messages"[0].content holds a lone surrogate'),
        ('{"messages": [{"role": "us\\ud83der", "content": "x"}]}', '"messages"[0].role holds a lone surrogate'),
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_line(tmp_path, line, said):
    """JSON's \\ud800 escape without its pair decodes to a string no tokenizer can encode: it was a transformers
    TypeError traceback, or read as the chat template's refusal."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine \\ud83d\\ude00"}\n' + line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: {said}")):
        read_prompts(path)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ('[{"prompt": "a"}, {"prompt": "b"}]', "p.jsonl:1: a JSON array: prompts files are JSONL, one JSON object a"),
        (
            '[{"prompt": "a"},\n {"prompt": "b"}]',
            "p.jsonl:1: not valid JSON (Expecting value at column 18); it starts a JSON array: prompts files are JSONL",
        ),
        ("[\n", "p.jsonl:1: not valid JSON (Expecting value at column 2); it starts a JSON array"),
        ('{"prompt": "ok"}\n{"prompt": "a\tb"}', "p.jsonl:2: not valid JSON (Invalid control character at column 14)"),
        ('{"prompt": "ok"} {"prompt": "b"}', "p.jsonl:1: not valid JSON (Extra data at column 18)"),
        ("null", "p.jsonl:1: null is not a JSON object: each line needs exactly one of"),
        ('"hi"', 'p.jsonl:1: "hi" is not a JSON object: each line needs exactly one of'),
    ],
)
def test_a_file_that_is_not_jsonl_is_named_as_such_with_the_column(tmp_path, content, said):
    """A JSON array of prompts read as a line without "prompt" (or, spread over lines, "Expecting value" alone);
    a parse error lost its column ("Invalid control character at"); a line of null read as a blank line."""
    path = tmp_path / "p.jsonl"
    path.write_text(content + "\n")
    with pytest.raises(ValueError) as err:
        read_prompts(path)
    assert str(err.value).startswith(f"{tmp_path}/{said}")


@pytest.mark.parametrize(
    ("ids", "said"),
    [
        ([1, -2, 3], '"prompt_ids"[1] is -2: expected an integer >= 0'),
        ([1, 2.5, 3], '"prompt_ids"[1] is 2.5: expected an integer >= 0'),
        ([1, float("nan")], '"prompt_ids"[1] is NaN: expected an integer >= 0'),
        ([1, 2, "3"], '"prompt_ids"[2] is "3": expected an integer >= 0'),
        ([True], '"prompt_ids"[0] is true: a boolean, not an integer'),
        ("1 2 3", '"prompt_ids" must be a list of integers >= 0, got "1 2 3"'),
    ],
)
def test_a_bad_token_id_is_named_with_its_index(tmp_path, ids, said):
    """Every bad "prompt_ids" was one message, naming neither the value nor where it is."""
    path = _write(tmp_path / "p.jsonl", [{"prompt_ids": [4]}, {"prompt_ids": ids}])
    with pytest.raises(ValueError) as err:
        read_prompts(path)
    assert str(err.value) == f"{path}:2: {said}"


@pytest.mark.parametrize(
    "message",
    [
        {"role": "developer", "content": "Answer briefly."},  # gpt-oss / OpenAI
        {"role": "ipython", "content": "42"},  # Llama 3.1's tool results
        {"role": "function", "content": "42", "name": "calc"},
        {"role": "assistant", "content": "4", "reasoning_content": "2 + 2"},  # Qwen3's template reads it
    ],
)
def test_roles_and_keys_a_chat_template_takes_are_kept_for_it(tmp_path, message):
    """Templates differ in the roles and keys they take: the reader keeps them for the template (which names a
    refusal with the line), where a closed list refused prompts files that worked before."""
    chat = [{"role": "system", "content": "Be brief."}, message]
    (line,) = read_prompts(_write(tmp_path / "p.jsonl", [{"messages": chat}]))
    assert line.messages == chat


def test_a_message_with_an_empty_role_is_refused(tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "ok"}, {"messages": [{"role": " ", "content": "hi"}]}])
    with pytest.raises(ValueError, match=rf'^{path}:2: "messages"\[0\].role is empty$'):
        read_prompts(path)


def test_the_keys_chat_templates_take_besides_are_kept(tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    chat = [
        {"role": "user", "content": "add", "name": "ann"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
    ]
    assert read_prompts(_write(tmp_path / "p.jsonl", [{"messages": chat}]))[0].messages == chat
