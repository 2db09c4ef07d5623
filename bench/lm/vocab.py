"""The character vocabulary of the language-model benchmark and its one transcript format.

Ids: four special tokens, then one id per character of `ALPHABET`, in its order.

    PAD = 0   padding; never part of a transcript
    BOS = 1   begins a transcript
    EOT = 2   ends an agent action: the policy emits it to say "this action is complete"
    SEP = 3   ends the prompt and every observation: the environment's turn is over

A transcript of a prompt and its turns (action, observation) is laid out as

    [BOS] prompt [SEP] action_1 [EOT] observation_1 [SEP] ... action_k [EOT] observation_k [SEP]

The learner uses this one layout both to sample (the ids before an action are `prefix`) and to train
(the tokens the policy generated are `Transcript.action_spans`), so what the policy was trained on is
exactly what it is asked to continue.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

PAD: Final = 0
BOS: Final = 1
EOT: Final = 2
SEP: Final = 3
SPECIAL_COUNT: Final = 4

ALPHABET: Final = string.digits + string.ascii_lowercase + string.ascii_uppercase + " " + "+-*/=:?,._()'"
VOCAB_SIZE: Final = SPECIAL_COUNT + len(ALPHABET)

_ID_OF_CHAR: Final = {char: SPECIAL_COUNT + index for index, char in enumerate(ALPHABET)}


def encode(text: str) -> list[int]:
    """The ids of `text`, one per character; a character outside `ALPHABET` is a bug in whoever wrote the
    text (a task, a prompt), so it raises rather than being dropped silently."""
    ids = []
    for char in text:
        token = _ID_OF_CHAR.get(char)
        if token is None:
            raise ValueError(f"character {char!r} is not in the vocabulary's alphabet")
        ids.append(token)
    return ids


def decode(ids: Sequence[int]) -> str:
    """The text of `ids`, skipping the special ids, so that a generated action decodes without its EOT."""
    return "".join(ALPHABET[token - SPECIAL_COUNT] for token in ids if token >= SPECIAL_COUNT)


@dataclass(frozen=True)
class Transcript:
    """The ids of a whole transcript and, per turn, the [start, end) positions of the action's tokens in
    `ids`, its EOT included: these are the tokens the policy generated, the only ones it is trained on."""

    ids: list[int]
    action_spans: list[tuple[int, int]]


def transcript(prompt: str, turns: Sequence[tuple[str, str]]) -> Transcript:
    """`[BOS] prompt [SEP]`, then for each (action, observation): `action [EOT] observation [SEP]`."""
    ids = [BOS, *encode(prompt), SEP]
    action_spans = []
    for action, observation in turns:
        start = len(ids)
        ids.extend(encode(action))
        ids.append(EOT)
        action_spans.append((start, len(ids)))
        ids.extend(encode(observation))
        ids.append(SEP)
    return Transcript(ids=ids, action_spans=action_spans)


def prefix(prompt: str, turns: Sequence[tuple[str, str]]) -> list[int]:
    """The ids the policy conditions on before it generates the action after `turns`: the transcript so
    far, ending in the SEP of the last observation (or of the prompt)."""
    return transcript(prompt, turns).ids
