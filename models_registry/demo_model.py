"""Build a tiny, deterministic Llama-architecture chat model from local data only.

The model is trained for a few minutes on synthetic conversations (demo_conversations,
demo_training) so that it answers briefly, calls tools and writes JSON that closes. The result
is cached under the data directory, keyed by the builder's source and the seed, so a machine
pays for the training once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from models_registry.demo_training import demo_model_train

if TYPE_CHECKING:
    from collections.abc import Callable

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 4096
# Special tokens of the tokenizer (bandit's B105 takes "_TOKEN" names for passwords).
BOS_TOKEN = "<|begin_of_text|>"  # nosec B105
EOS_TOKEN = "<|end_of_text|>"  # nosec B105
IM_START_TOKEN = "<|im_start|>"  # nosec B105
IM_END_TOKEN = "<|im_end|>"  # nosec B105
PAD_TOKEN = "<|pad|>"  # nosec B105
# Order fixes the ids: the trainer assigns special tokens ids 0..4 in this order.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN, PAD_TOKEN)

# ChatML, with tools as Hermes and Qwen2.5 write them: the tools listed in a system block,
# calls as <tool_call> JSON (vLLM's "hermes" tool parser reads them back), results in a user
# turn as <tool_response>. A conversation without tools renders as plain ChatML. Qwen3's
# `enable_thinking` (sent in chat_template_kwargs) gives the template a variable to act on,
# and an earlier answer's thinking (`reasoning_content`) is shown in a <think> block.
# A request's `reasoning_effort` opens the prompt, in a system block of its own, as gpt-oss's
# template writes it. Documents (a RAG request's `documents`) come next, in a system block
# of their own, each document's fields one a line.
CHAT_TEMPLATE = (
    "{%- if reasoning_effort %}"
    "{{- '<|im_start|>system\\nReasoning: ' + reasoning_effort + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- if documents %}"
    "{{- '<|im_start|>system\\n# Documents\\n' }}"
    "{%- for document in documents %}"
    "{{- '\\n' }}"
    "{%- for key, value in document.items() %}{{- key + ': ' + value + '\\n' }}{%- endfor %}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call['function'] is defined %}"
    "{%- set tool_call = tool_call['function'] %}"
    "{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['reasoning_content'] %}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    # Qwen3's switch (a chat_template_kwargs variable): false writes an empty thinking block;
    # true opens one for the model to think in (so a thinking budget can close it).
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- elif enable_thinking is defined and enable_thinking %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# A fixed list (not a glob) keeps the corpus, and so the vocabulary, stable and small.
CORPUS_FILES = (
    "argparse.py",
    "ast.py",
    "base64.py",
    "bisect.py",
    "calendar.py",
    "collections/__init__.py",
    "configparser.py",
    "contextlib.py",
    "copy.py",
    "csv.py",
    "dataclasses.py",
    "datetime.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "gettext.py",
    "glob.py",
    "heapq.py",
    "inspect.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "os.py",
    "pprint.py",
    "random.py",
    "shlex.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "subprocess.py",
    "tempfile.py",
    "textwrap.py",
    "threading.py",
    "tokenize.py",
    "typing.py",
    "uuid.py",
    "warnings.py",
    "weakref.py",
)

HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 512
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
MAX_POSITION_EMBEDDINGS = 2048
# The builder's own modules: a change to any of them is a new model, so a new cache entry.
BUILDER_MODULES = ("demo_model.py", "demo_conversations.py", "demo_training.py")


def demo_model_build(*, out_dir: Path, seed: int = 0) -> Path:
    """Build the demo model into out_dir atomically and return out_dir.

    A model built before on this machine from the same builder source and seed is copied from
    the cache; otherwise it is built, trained and added to the cache.
    """
    out_dir = Path(out_dir).resolve()
    if out_dir.exists():
        msg = f"{out_dir} already exists"
        raise FileExistsError(msg)
    cached = demo_model_cache_dir(seed=seed)
    if not (cached / "config.json").exists():
        try:
            _build_atomically(cached, lambda target: _write_model_files(target, seed=seed))
        except PermissionError:
            # A read-only data directory (an image's): build without keeping a copy.
            _build_atomically(out_dir, lambda target: _write_model_files(target, seed=seed))
            return out_dir
    _build_atomically(out_dir, lambda target: shutil.copytree(cached, target, dirs_exist_ok=True))
    return out_dir


def demo_model_cache_dir(*, seed: int) -> Path:
    """Return where the model built from this source and seed is cached (it may not exist).

    ROUNDHOUSE_DEMO_MODEL_CACHE names the folder (the test session points it at the checkout's
    own, since it gives each session a fresh data directory); otherwise it is under the data
    directory.
    """
    digest = hashlib.sha256(f"seed={seed}\n".encode())
    here = Path(__file__).resolve().parent
    for name in BUILDER_MODULES:
        digest.update((here / name).read_bytes())
    root = os.environ.get("ROUNDHOUSE_DEMO_MODEL_CACHE")
    if root is None:
        data_dir = Path(os.environ.get("ROUNDHOUSE_DATA_DIR", here.parent / ".data"))
        root = str(data_dir / "cache" / "demo-model")
    return Path(root) / digest.hexdigest()[:16]


def _build_atomically(out_dir: Path, write: Callable[[Path], object]) -> None:
    """Write into a temporary sibling of out_dir, then rename it into place."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(tmp_dir)
        _make_readable(tmp_dir)
        tmp_dir.rename(out_dir)
    except OSError:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        # Another process filled the same cache entry first: theirs is as good as ours.
        if not (out_dir / "config.json").exists():
            raise
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def _make_readable(target: Path) -> None:
    """Give target and its files ordinary read permissions."""
    # mkdtemp and the safetensors writer create owner-only (0700/0600) entries.
    target.chmod(0o755)
    for path in target.iterdir():
        path.chmod(0o644)


def _write_model_files(target: Path, *, seed: int) -> None:
    """Write tokenizer, weights, config and generation config into target."""
    tokenizer = _train_tokenizer(_corpus_paths())
    hf_tokenizer = _wrap_tokenizer(tokenizer)
    hf_tokenizer.save_pretrained(str(target))
    _save_model(target, seed=seed, token_ids=_special_token_ids(tokenizer), tokenizer=hf_tokenizer)


def _corpus_paths() -> list[Path]:
    """Return the sorted stdlib source files used as tokenizer training text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(stdlib / name for name in CORPUS_FILES if (stdlib / name).is_file())
    if not paths:
        msg = f"no corpus files found under {stdlib}"
        raise FileNotFoundError(msg)
    return paths


def _train_tokenizer(paths: list[Path]) -> Tokenizer:
    """Train a byte-level BPE tokenizer on the given files."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(path) for path in paths], trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        msg = f"tokenizer vocab is {tokenizer.get_vocab_size()}, not {VOCAB_SIZE}"
        raise RuntimeError(msg)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    # Llama convention: plain (non-chat) encodes start with BOS; chat templates are
    # rendered with add_special_tokens=False so they do not get a second one.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def _wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a trained tokenizer as a transformers tokenizer with a chat template."""
    from transformers import PreTrainedTokenizerFast

    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=IM_END_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[EOS_TOKEN, IM_START_TOKEN],
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    return hf_tokenizer


def _special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """Map each special token to its id in tokenizer."""
    ids: dict[str, int] = {}
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            msg = f"special token {token} missing from tokenizer"
            raise RuntimeError(msg)
        ids[token] = token_id
    return ids


def _save_model(
    target: Path,
    *,
    seed: int,
    token_ids: dict[str, int],
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Initialise the Llama model from seed, train it and save it to target."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    # Chat turns end with <|im_end|>; <|end_of_text|> still ends raw completions.
    eos_ids = [token_ids[IM_END_TOKEN], token_ids[EOS_TOKEN]]
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        bos_token_id=token_ids[BOS_TOKEN],
        eos_token_id=eos_ids,
        pad_token_id=token_ids[PAD_TOKEN],
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    demo_model_train(model=model, tokenizer=tokenizer, seed=seed)
    model.generation_config = GenerationConfig(
        bos_token_id=token_ids[BOS_TOKEN],
        eos_token_id=eos_ids,
        pad_token_id=token_ids[PAD_TOKEN],
    )
    model.save_pretrained(str(target), safe_serialization=True)


def whitespace_token_ids(model_dir: Path) -> list[int]:
    """The demo tokenizer's tokens that are only whitespace (not its special tokens).

    The conformance cases and bench/structured.py bias these away (`logit_bias` -100), from
    when the demo model's weights were random and under a JSON grammar its likeliest token
    was whitespace forever.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    ids = []
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if text and not text.strip() and tokenizer.id_to_token(token_id) not in special:
            ids.append(token_id)
    return ids
