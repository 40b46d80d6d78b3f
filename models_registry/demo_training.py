"""Train the demo model on its synthetic conversations: CPU, seeded, a fixed number of steps.

Every conversation is rendered with the model's own chat template, cut where the generation
prompt ends, and only the answer after it (through `<|im_end|>`, the turn's stop token) is
learned. Determinism: the same seed on the same machine gives the same weights; another CPU
or torch build may round its kernels differently in the last bits.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from models_registry.demo_conversations import Conversation, conversations_generate

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

CONVERSATIONS = 16000
STEPS = 450
TOKENS_PER_BATCH = 4096
MAX_LENGTH = 448
LEARNING_RATE = 4e-3
WARMUP_STEPS = 40
# Whitespace's unlikelihood, against cross-entropy's weight of one.
WHITESPACE_WEIGHT = 3.0
# One thread: on two cores shared with other work, two of torch's threads wait on each other
# (measured 0.3 s a step with one, 1 to 3 s with two); one is also the same on every machine.
THREADS = 1
IGNORE = -100


@dataclass(frozen=True)
class Example:
    """One conversation's token ids and, per position, the id to learn (IGNORE where none)."""

    ids: list[int]
    labels: list[int]


def examples_render(
    *, conversations: list[Conversation], tokenizer: PreTrainedTokenizerFast, rng: random.Random
) -> list[Example]:
    """Tokenize each conversation as vLLM would prompt it, learning only its last answer."""
    im_end = tokenizer.eos_token
    examples = []
    for conversation in conversations:
        tools = cast("list[dict[Any, Any] | Callable[..., Any]] | None", conversation.tools)
        prompt = tokenizer.apply_chat_template(
            conversation.messages[:-1],
            tools=tools,
            add_generation_prompt=True,
            tokenize=False,
        )
        full = tokenizer.apply_chat_template(conversation.messages, tools=tools, tokenize=False)
        assert isinstance(prompt, str) and isinstance(full, str)
        if not full.startswith(prompt):
            msg = f"the template's answer does not follow its generation prompt: {full!r}"
            raise ValueError(msg)
        answer = full[len(prompt) :]
        answer = answer[: answer.index(im_end) + len(im_end)]
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        answer_ids = [
            token_id
            for piece in _pieces(answer, rng=rng)
            for token_id in tokenizer.encode(piece, add_special_tokens=False)
        ]
        ids = prompt_ids + answer_ids
        if len(ids) > MAX_LENGTH:
            continue
        # Position i predicts token i + 1: the answer's tokens are learned from the prompt's
        # last position on.
        labels = [IGNORE] * (len(prompt_ids) - 1) + answer_ids + [IGNORE]
        examples.append(Example(ids=ids, labels=labels))
    return examples


def _pieces(answer: str, *, rng: random.Random) -> list[str]:
    """Cut a JSON answer at some of its punctuation, to be tokenized piece by piece.

    A grammar forces characters, not tokens: where it makes the model write a key's closing
    quote alone (not the `": ` token the text would merge into), the model must still know
    the colon comes next. Seven in ten JSON answers are learned cut this way, at a third of
    their punctuation.
    """
    if "{" not in answer or rng.random() < 0.3:
        return [answer]
    pieces = [""]
    for part in re.split(r'(["{}\[\]:,])', answer):
        if part and rng.random() < 1 / 3:
            pieces.append(part)
        else:
            pieces[-1] += part
    return [piece for piece in pieces if piece]


def _batches(examples: list[Example], *, rng: random.Random) -> list[list[Example]]:
    """Group examples of similar length into batches of about TOKENS_PER_BATCH tokens."""
    ordered = sorted(examples, key=lambda example: len(example.ids))
    batches: list[list[Example]] = []
    current: list[Example] = []
    for example in ordered:
        if current and len(example.ids) * (len(current) + 1) > TOKENS_PER_BATCH:
            batches.append(current)
            current = []
        current.append(example)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _tensors(batch: list[Example], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    width = max(len(example.ids) for example in batch)
    ids = [example.ids + [pad_id] * (width - len(example.ids)) for example in batch]
    labels = [example.labels + [IGNORE] * (width - len(example.labels)) for example in batch]
    return torch.tensor(ids), torch.tensor(labels)


def demo_model_train(
    *, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, seed: int
) -> float:
    """Train model in place for STEPS steps and return the mean loss of the last 50."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(THREADS)
    rng = random.Random(seed)  # nosec B311: shuffling training data, seeded to be repeatable
    examples = examples_render(
        conversations=conversations_generate(count=CONVERSATIONS, seed=seed),
        tokenizer=tokenizer,
        rng=rng,
    )
    pad_id = tokenizer.pad_token_id
    assert isinstance(pad_id, int)
    whitespace = torch.tensor(whitespace_ids(tokenizer))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.01
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule)
    model.train()
    losses: list[float] = []
    batches: list[list[Example]] = []
    for _ in range(STEPS):
        if not batches:
            batches = _batches(examples, rng=rng)
        ids, labels = _tensors(batches.pop(), pad_id=pad_id)
        # The head runs only where a token is learned: most positions are prompt, and the
        # 4096-wide head costs as much as both layers together.
        hidden = model.model(input_ids=ids).last_hidden_state
        learned = labels != IGNORE
        loss = _loss(model.lm_head(hidden[learned]), labels[learned], whitespace=whitespace)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    tail = losses[-50:]
    return sum(tail) / len(tail)


def _loss(logits: torch.Tensor, targets: torch.Tensor, *, whitespace: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, plus the unlikelihood of whitespace where the answer has none.

    A JSON grammar allows whitespace between any two tokens: where it forces a key the model
    did not expect, a model that never learned to avoid whitespace pads until max_tokens.
    """
    import torch

    loss = torch.nn.functional.cross_entropy(logits, targets)
    spaced = logits.log_softmax(-1)[:, whitespace].logsumexp(-1).exp()
    elsewhere = ~torch.isin(targets, whitespace)
    return loss - WHITESPACE_WEIGHT * torch.log1p(-spaced[elsewhere].clamp(max=0.999)).mean()


def whitespace_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Return the ids of the tokens that are only whitespace (none of the special tokens)."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return [
        token_id
        for token_id in range(len(tokenizer))
        if token_id not in special
        and (text := str(tokenizer.decode([token_id])))
        and not text.strip()
    ]


def _schedule(step: int) -> float:
    """Warm up linearly, then decay along a cosine to a tenth of the peak rate."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, STEPS - WARMUP_STEPS)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
