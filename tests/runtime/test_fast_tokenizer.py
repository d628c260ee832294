"""The front end's torch-free tokenizer gives transformers' ids, text and chat prompts, token for token: on the
embedded SmolLM2 and on tiny tokenizers built here that pin BOS post-processing, clean-up and special tokens."""
from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.fast_tokenizer import ChatTemplateError, FastTokenizer, render_chat
from toolkit.runtime.model_loader.tokenizer import (
    load_fast_tokenizer,
    prepare_tokenizer_folder,
    tokenizer_cache_dir,
)

CORPUS = [
    "Hello, world. How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé: 中文字符 and emoji 🤖🎉",
    "don't stop, I'm here; we're fine.",
] * 5
BPE_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
WORDS = ["[UNK]", "[BOS]", "hello", "world", ",", ".", "!", "?", "i", "'m", "n't", "do", "[EOS]", "'", "t", "don"]

# Llama-3-like: block tags on their own, indented lines (trim_blocks / lstrip_blocks decide the newlines), and
# every helper transformers gives a template: raise_exception, tojson, strftime_now, namespace, loop controls,
# {% generation %}, the bos/eos token variables and add_generation_prompt.
BPE_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' and not loop.first %}
        {{ raise_exception('the system message must come first') }}
    {% endif %}
    {% if message['role'] == 'tool' %}
        {% continue %}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>
    {% if message.name is defined %}
({{ message.name }})
    {% endif %}
    {% if message['role'] == 'system' %}
{{ {'system': message['content'], 'year_digits': strftime_now('%Y') | length} | tojson }}{{ eos_token }}
    {% elif message['role'] == 'assistant' %}
{% generation %}{{ message['content'] | trim }}{% endgeneration %}{{ eos_token }}
    {% else %}
{{ message['content'] | trim }}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}
"""
WORDLEVEL_TEMPLATE = "{% for m in messages %}{{ bos_token }} {{ m['content'] }} {{ eos_token }}\n{% endfor %}"

CHATS = [
    [{"role": "user", "content": "Hello, how are you?"}],
    [{"role": "system", "content": "You are <b>terse</b> & kind 🤖"},
     {"role": "user", "content": "  What is 中文?  "},
     {"role": "assistant", "content": "A language."},
     {"role": "user", "content": "Thanks!\n\nBye."}],
    [{"role": "user", "content": "<|eot_id|> is text here, <|im_start|> too", "name": None},
     {"role": "tool", "content": "skipped"},
     {"role": "assistant", "content": "ok", "name": "bot"}],
]


@dataclass
class Pair:
    fast: FastTokenizer
    reference: Any  # transformers' tokenizer for the same folder
    texts: list[str]


def _reference_ids(reference, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    encoded = reference.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def _train_bpe(add_prefix_space: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=BPE_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def _write_bpe_folder(folder: Path) -> Path:
    """A Llama-3-style folder as transformers saves it: the post-processor adds BOS, clean-up is asked for."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = _train_bpe(add_prefix_space=False)
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", bos)]
    )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                                      eos_token="<|eot_id|>", clean_up_tokenization_spaces=True)
    wrapped.chat_template = BPE_TEMPLATE
    wrapped.save_pretrained(str(folder))
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("{{ raise_exception('not this one') }}")
    return folder


def _write_wordlevel_folder(folder: Path) -> Path:
    """An older hand-written folder: special tokens in special_tokens_map.json, [EOS] a plain vocabulary word in
    tokenizer.json, <tool> and <image> not in it at all, named chat templates in the config, clean-up on (not BPE)."""
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["[UNK]", "[BOS]"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", pair="[BOS] $A $B", special_tokens=[("[BOS]", 1)]
    )
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": True,
              "image_token": "<image>",
              "chat_template": [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                                {"name": "default", "template": WORDLEVEL_TEMPLATE}]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    special = {"bos_token": "[BOS]", "unk_token": "[UNK]", "additional_special_tokens": ["<tool>"],
               "eos_token": {"content": "[EOS]", "lstrip": False, "rstrip": False, "normalized": False}}
    (folder / "special_tokens_map.json").write_text(json.dumps(special))
    return folder


def _write_modern_folder(folder: Path, bpe_folder: Path) -> Path:
    """The BPE folder as transformers 4.x saved it: the config's added_tokens_decoder wins over tokenizer.json (it
    un-specials a header token and adds a reserved one) and special_tokens_map.json is ignored."""
    folder.mkdir()
    written = Tokenizer.from_file(str(bpe_folder / "tokenizer.json"))
    written.save(str(folder / "tokenizer.json"))
    added = {str(index): {"content": token.content, "lstrip": False, "rstrip": False, "normalized": False,
                          "single_word": False, "special": token.content != "<|start_header_id|>"}
             for index, token in written.get_added_tokens_decoder().items()}
    added[str(written.get_vocab_size())] = {"content": "<|reserved_0|>", "lstrip": False, "rstrip": False,
                                            "normalized": False, "single_word": False, "special": True}
    config = json.loads((bpe_folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "added_tokens_decoder": added}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|end_header_id|>"}))
    shutil.copy(bpe_folder / "chat_template.jinja", folder / "chat_template.jinja")
    return folder


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory) -> Path:
    return _write_bpe_folder(tmp_path_factory.mktemp("tok") / "bpe")


@pytest.fixture(scope="module")
def wordlevel_folder(tmp_path_factory) -> Path:
    return _write_wordlevel_folder(tmp_path_factory.mktemp("tok") / "wordlevel")


def _auto_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


EMBEDDED_TEXTS = [
    "Hello, world!", "", " ", "  leading spaces", "trailing spaces   ", "\n", "line one\nline two\n\n\nline five",
    "windows\r\nnewlines\ttabs", "emoji 🤖🎉👍🏽 and flags 🇫🇷", "中文字符和日本語のテキスト", "Ünïcödé ça va? naïve café",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "text<|endoftext|>more", "<|im_start|><|im_end|>",
    "def f(x):\n    return x ** 2  # comment", "don't I'm we're they've", "a" * 300,
]


@pytest.fixture(scope="module", params=["embedded", "bpe", "modern", "wordlevel"])
def pair(request, embedded_tokenizer, tmp_path_factory) -> Pair:
    if request.param == "embedded":
        return Pair(load_fast_tokenizer(prepare_tokenizer_folder(None)), embedded_tokenizer, EMBEDDED_TEXTS)
    if request.param == "wordlevel":
        folder = request.getfixturevalue("wordlevel_folder")
        texts = ["hello, world.", "hello [EOS] world", "<tool> hello<image>", "", "i don't!", "  hello  ", "what ?"]
        return Pair(load_fast_tokenizer(folder), _auto_tokenizer(folder), texts)
    folder = request.getfixturevalue("bpe_folder")
    if request.param == "modern":
        folder = _write_modern_folder(tmp_path_factory.mktemp("tok") / "modern", folder)
    texts = [*EMBEDDED_TEXTS, "<|begin_of_text|>twice", "Hello , world . don 't", "<|reserved_0|><|eot_id|>"]
    return Pair(load_fast_tokenizer(folder), _auto_tokenizer(folder), texts)


# ---- token for token against transformers ----

def test_encode_matches_transformers(pair):
    for text in pair.texts:
        assert pair.fast.encode(text) == pair.reference.encode(text), text
        assert pair.fast.encode(text, add_special_tokens=False) == pair.reference.encode(
            text, add_special_tokens=False), text


def test_decode_matches_transformers_with_and_without_special_tokens(pair):
    rng = random.Random(0)
    vocab, special_ids = len(pair.reference), sorted(pair.reference.added_tokens_decoder)
    for _ in range(150):
        ids = [rng.choice(special_ids) if rng.random() < 0.25 else rng.randrange(vocab)
               for _ in range(rng.randrange(16))]
        for skip in (False, True):
            assert pair.fast.decode(ids, skip_special_tokens=skip) == pair.reference.decode(
                ids, skip_special_tokens=skip), (ids, skip)


def test_chat_prompts_match_transformers(pair):
    for messages in CHATS:
        for add_generation_prompt in (True, False):
            ours = pair.fast.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
            assert ours == _reference_ids(pair.reference, messages, add_generation_prompt), messages


def test_special_token_ids_templates_and_template_variables_match_transformers(pair):
    assert (pair.fast.bos_token_id, pair.fast.eos_token_id) == (pair.reference.bos_token_id,
                                                                pair.reference.eos_token_id)
    assert pair.fast.special_tokens_map == pair.reference.special_tokens_map
    assert pair.fast.chat_template == pair.reference.chat_template


# ---- what the parity above rests on, pinned directly ----

def test_post_processor_adds_bos_once_and_chat_prompts_carry_the_templates_bos(bpe_folder):
    fast = load_fast_tokenizer(bpe_folder)
    bos = fast.bos_token_id
    assert fast.encode("Hello")[0] == bos and fast.encode("Hello")[1:] == fast.encode("Hello", add_special_tokens=False)
    assert bos not in fast.encode("Hello", add_special_tokens=False)
    prompt = fast.apply_chat_template(CHATS[0], add_generation_prompt=True)
    assert prompt[0] == bos and prompt.count(bos) == 1


def test_embedded_prompt_text_is_smollm2s_chatml():
    fast = load_fast_tokenizer(prepare_tokenizer_folder(None))
    text = fast.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n")
    assert (fast.bos_token_id, fast.eos_token_id) == (1, 2)


def test_clean_up_spaces_applies_to_wordlevel_but_never_to_bpe(bpe_folder, wordlevel_folder):
    words = load_fast_tokenizer(wordlevel_folder)
    i, am, hello, comma, world, stop = (WORDS.index(word) for word in ("i", "'m", "hello", ",", "world", "."))
    assert words.decode([i, am, hello, comma, world, stop]) == "i'm hello, world."
    bpe = load_fast_tokenizer(bpe_folder)
    assert bpe.decode(bpe.encode("Hello , world .", add_special_tokens=False)) == "Hello , world ."


def test_special_tokens_from_the_config_become_special_in_the_vocabulary(wordlevel_folder):
    fast = load_fast_tokenizer(wordlevel_folder)
    image, tool = len(WORDS), len(WORDS) + 1  # not in tokenizer.json: appended, named tokens first
    assert fast.encode("hello [EOS] <tool><image>", add_special_tokens=False) == [2, 12, tool, image]
    assert (fast.eos_token_id, fast.special_tokens_map["image_token"]) == (12, "<image>")
    assert fast.decode([1, 2, 12, tool, 3, image], skip_special_tokens=True) == "hello world"


def test_split_special_tokens_and_no_truncation_or_padding_as_transformers_encodes(bpe_folder, tmp_path):
    folder = tmp_path / "split"
    folder.mkdir()
    written = Tokenizer.from_file(str(bpe_folder / "tokenizer.json"))
    written.enable_truncation(max_length=3)
    written.enable_padding(length=40)
    written.save(str(folder / "tokenizer.json"))
    config = json.loads((bpe_folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "split_special_tokens": True}))
    fast, reference = load_fast_tokenizer(folder), _auto_tokenizer(folder)
    text = "<|eot_id|>Hello, world. How are you today?"
    assert fast.encode(text) == reference.encode(text)
    assert len(fast.encode(text)) > 10 and fast.eos_token_id not in fast.encode(text)


def test_template_helpers_render_like_transformers():
    template = ("{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m | tojson }}|{{ bos_token }}\n"
                "    {% endif %}\n{% endfor %}{{ strftime_now('%Y') | length }}")
    messages = [{"role": "user", "content": "<b>é🤖</b>", "name": None}, {"role": "system", "content": "x"}]
    assert render_chat(template, messages, False, {"bos_token": "<s>"}) == \
        '{"role": "user", "content": "<b>é🤖</b>"}|<s>\n4'


def test_raise_exception_in_a_template_raises_chat_template_error_as_in_transformers(bpe_folder):
    wrong_order = [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]
    with pytest.raises(ChatTemplateError, match="the system message must come first"):
        load_fast_tokenizer(bpe_folder).apply_chat_template(wrong_order, add_generation_prompt=True)
    with pytest.raises(Exception, match="the system message must come first"):
        _reference_ids(_auto_tokenizer(bpe_folder), wrong_order, True)


def test_chat_template_is_settable_and_missing_or_broken_templates_are_named(wordlevel_folder):
    fast = load_fast_tokenizer(wordlevel_folder)
    assert fast.apply_chat_template(CHATS[0], tokenize=False) == "[BOS] Hello, how are you? [EOS]\n"  # 'default'
    fast.chat_template = "{{ messages[0]['content'] }} !"
    assert fast.apply_chat_template([{"role": "user", "content": "hello"}]) == [2, 6]
    fast.chat_template = "{% for m in messages %}unclosed"
    with pytest.raises(ChatTemplateError, match="TemplateSyntaxError"):
        fast.apply_chat_template(CHATS[0])
    fast.chat_template = {"tool_use": "x"}
    with pytest.raises(ChatTemplateError, match=r"\['tool_use'\] but no 'default'"):
        fast.apply_chat_template(CHATS[0])
    fast.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template; start the server with --chat-template"):
        fast.apply_chat_template(CHATS[0])


# ---- the front end stays light ----

TORCH_FREE_CHECK = """
import json, sys
from toolkit.runtime.model_loader.tokenizer import load_fast_tokenizer
fast = load_fast_tokenizer(sys.argv[1])
ids = fast.encode("Hello, world")
prompt = fast.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
print(json.dumps({"ids": ids, "text": fast.decode(prompt, skip_special_tokens=True),
                  "heavy": sorted(name for name in ("torch", "transformers") if name in sys.modules)}))
"""


def test_loading_and_using_the_fast_tokenizer_never_imports_torch_or_transformers(bpe_folder):
    run = subprocess.run([sys.executable, "-c", TORCH_FREE_CHECK, str(bpe_folder)], capture_output=True,
                         text=True, timeout=60, check=True)
    result = json.loads(run.stdout)
    assert result["heavy"] == []
    assert result["ids"] == load_fast_tokenizer(bpe_folder).encode("Hello, world")
    assert "Hi" in result["text"]


# ---- prepare_tokenizer_folder ----

def test_a_folder_transformers_runs_as_written_is_used_in_place(bpe_folder):
    assert prepare_tokenizer_folder(bpe_folder) == bpe_folder


def test_the_gguf_tokenizer_comes_from_the_conversion_cache():
    folder = prepare_tokenizer_folder(None)
    assert folder.parent == tokenizer_cache_dir() and (folder / "tokenizer.json").is_file()


def test_a_tokenizer_class_that_rebuilds_the_pipeline_is_converted_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "gpt2"
    folder.mkdir()
    written = _train_bpe(add_prefix_space=True)  # GPT2Tokenizer rebuilds with add_prefix_space=False
    written.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    reference = _auto_tokenizer(folder)
    assert written.encode("Hello world").ids != reference.encode("Hello world")  # the case is real
    prepared = prepare_tokenizer_folder(folder)
    converted_at = (prepared / "tokenizer.json").stat().st_mtime_ns
    with caplog.at_level(logging.WARNING):
        assert prepared.parent == tokenizer_cache_dir() and prepare_tokenizer_folder(folder) == prepared
    assert (prepared / "tokenizer.json").stat().st_mtime_ns == converted_at and not caplog.records
    fast = load_fast_tokenizer(prepared)
    for text in EMBEDDED_TEXTS:
        assert fast.encode(text) == reference.encode(text), text
    assert fast.decode(list(range(len(reference))), skip_special_tokens=True) == reference.decode(
        list(range(len(reference))), skip_special_tokens=True)


def test_folders_without_tokenizer_files_are_named(tmp_path):
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        prepare_tokenizer_folder(tmp_path)
    with pytest.raises(ModelLoadError, match=r"no tokenizer\.json \(prepare the folder"):
        load_fast_tokenizer(tmp_path)
