"""The policy of the language-model benchmark: a tiny decoder-only transformer over a character vocabulary
(ids 0 … V−1, PAD = 0), batched sampling with a KV cache, and the token log-probabilities the
policy-gradient loss (`bench.lm.grpo`) trains.

The architecture is GPT-2's at toy size: learned token and position embeddings, pre-LayerNorm blocks

    x ← x + Attn(LN(x)),    x ← x + MLP(LN(x)),    MLP(x) = W₂ GELU(W₁ x),  W₁ of width 4·d_model,

a final LayerNorm, and logits = h Eᵀ + b with E the token embedding (tied weights) and b a free bias per
token (the unigram preference of a character vocabulary, which the tied weights alone express poorly).
No dropout: an RL policy's sampling and its gradient must see the same function.

Attention is written out, softmax(q kᵀ / √d_head + M) v, with M = −∞ where a key lies after the query
(causal) or is padding. A query always sees its own key, so a padding query (never read) gets a finite
row instead of a row of −∞ whose NaNs would reach the real rows through 0 · NaN in the product with v.

Sampling left-pads the prefixes so that every sequence's next token lands in the same cache slot; the
position ids restart at 0 at each sequence's first real token, so a prefix gets the same positions — and
the same logits, up to float rounding — alone or in any batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PAD_ID = 0
INIT_STD = 0.02  # GPT-2's initialisation of every weight matrix and embedding


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 256

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.d_model, self.n_layers, self.n_heads, self.max_len) < 1:
            raise ValueError(f"every size must be positive: {self}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def parameter_count(self) -> int:
        """V·D + V (tied embedding, output bias) + L·D (positions) + n_layers · (12·D² + 13·D) + 2·D.

        A block: two LayerNorms (2·2D), q, k, v and output projections (4·D² + 4·D), MLP (8·D² + 5·D).
        """
        d = self.d_model
        block = 12 * d * d + 13 * d
        return self.vocab_size * (d + 1) + self.max_len * d + self.n_layers * block + 2 * d


class KVCache:
    """Every layer's keys and values for the cache slots filled so far, preallocated to `capacity` slots.

    Slot s holds the s-th token fed (padding included) of every row; `key_mask` marks the slots of real
    tokens. `TinyLM.extend` writes the next slots; `keep_rows` drops finished rows from the batch.
    """

    def __init__(
        self, config: ModelConfig, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        shape = (batch_size, config.n_heads, capacity, config.head_dim)
        self.keys = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.values = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.key_mask = torch.zeros(batch_size, capacity, device=device, dtype=torch.bool)
        self.capacity = capacity
        self.length = 0

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only the batch rows `rows` (indices, in the order given)."""
        self.keys = [keys.index_select(0, rows) for keys in self.keys]
        self.values = [values.index_select(0, rows) for values in self.values]
        self.key_mask = self.key_mask.index_select(0, rows)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Tensor, allowed: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        """x [B,T,D]; allowed [B,1,T,S] bool: query t may attend to key slot s. With a cache the new keys
        and values go to slots cache.length … cache.length+T−1 and the queries see slots 0 … S−1."""
        batch, steps, d_model = x.shape
        query, key, value = (
            part.view(batch, steps, self.n_heads, self.head_dim).transpose(1, 2)
            for part in self.qkv(x).split(d_model, dim=-1)
        )
        if cache is not None:
            end = cache.length + steps
            cache.keys[layer][:, :, cache.length : end] = key
            cache.values[layer][:, :, cache.length : end] = value
            key, value = cache.keys[layer][:, :, :end], cache.values[layer][:, :, :end]
        scores = (query @ key.transpose(-2, -1)) / math.sqrt(self.head_dim)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        context = (weights @ value).transpose(1, 2).reshape(batch, steps, d_model)
        out: Tensor = self.out(context)
        return out


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )

    def forward(self, x: Tensor, allowed: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        x = x + self.attention(self.attention_norm(x), allowed, cache, layer)
        out: Tensor = x + self.mlp(self.mlp_norm(x))
        return out


@dataclass(frozen=True)
class Samples:
    """What `TinyLM.sample` generated, one entry per prefix.

    tokens: the generated ids, the stop id included when the sequence stopped on it.
    logprobs: log softmax(logits / temperature)[token] of each generated token: the log-probability under
        the distribution it was drawn from, which is the policy's own log π_θ at temperature 1 (the
        default). Greedy decoding ignores the temperature: log π_θ of the argmax.
    features: the mean over the prefix's real tokens of the final (post-LayerNorm) hidden state, its first
        `feature_dim` dimensions; empty lists when feature_dim is 0.
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    features: list[list[float]]


class TinyLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    @property
    def device(self) -> torch.device:
        return self.token_embedding.weight.device

    def forward(
        self, ids: Tensor, positions: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        """Logits [B,T,V] of the next token after each prefix ids[b, :t+1]; see `hidden`."""
        return self._project(self.hidden(ids, positions, attention_mask))

    def hidden(
        self, ids: Tensor, positions: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        """Final (post-LayerNorm) hidden states [B,T,D] of ids [B,T], causal.

        positions [B,T] default to 0 … T−1; attention_mask [B,T] bool marks the real tokens (False:
        padding, never attended to by another token), all real by default.
        """
        return self._hidden_states(ids, positions, attention_mask, cache=None)

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        """An empty KV cache of `capacity` slots on the model's device, for `extend`."""
        return KVCache(self.config, batch_size, capacity, self.device, self.token_embedding.weight.dtype)

    def extend(self, ids: Tensor, positions: Tensor, attention_mask: Tensor, cache: KVCache) -> Tensor:
        """Feed ids [B,T] after the tokens already in `cache` (which takes their keys and values) and
        return their logits [B,T,V]: the same as a forward over every token fed so far, without
        recomputing the earlier ones."""
        return self._project(self._hidden_states(ids, positions, attention_mask, cache))

    def token_logprobs(self, ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B,T]: log π(ids[b,t] | ids[b,:t]) for t ≥ 1 at real tokens; 0 at t = 0 and at padding.

        The batch is right-padded (`bench.lm.grpo.pad_batch`), so the default positions 0 … T−1 are
        every sequence's own.
        """
        logprobs = F.log_softmax(self(ids, attention_mask=attention_mask)[:, :-1], dim=-1)
        chosen = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)
        chosen = torch.where(attention_mask[:, 1:], chosen, torch.zeros_like(chosen))
        return torch.cat([torch.zeros_like(chosen[:, :1]), chosen], dim=1)

    @torch.no_grad()
    def sample(
        self,
        prefixes: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop_id: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        greedy: bool = False,
        feature_dim: int = 0,
    ) -> Samples:
        """Continue every prefix until it emits `stop_id` (kept in its tokens) or has `max_new_tokens`.

        One forward over the left-padded prefixes fills a KV cache; then each step feeds the last token
        of the unfinished sequences only (finished rows leave the batch and the cache) and reads the next
        from softmax(logits / temperature), or its argmax when `greedy`. The model runs on its device;
        the draw runs on the generator's device when a generator is given (seed it for reproducibility).
        """
        longest = max((len(prefix) for prefix in prefixes), default=0)
        if min((len(prefix) for prefix in prefixes), default=1) < 1:
            raise ValueError("every prefix needs at least one token")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must not be negative, not {max_new_tokens}")
        if longest + max_new_tokens > self.config.max_len:
            raise ValueError(
                f"a prefix of {longest} tokens and {max_new_tokens} new ones "
                f"exceed max_len {self.config.max_len}"
            )
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be positive, not {temperature}")
        if not 0 <= feature_dim <= self.config.d_model:
            raise ValueError(f"feature_dim {feature_dim} is not in 0 … d_model {self.config.d_model}")
        tokens: list[list[int]] = [[] for _ in prefixes]
        logprobs: list[list[float]] = [[] for _ in prefixes]
        if not prefixes:
            return Samples(tokens, logprobs, [])

        ids, mask = left_pad(prefixes, self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = self.new_cache(len(prefixes), longest + max_new_tokens)
        hidden = self._hidden_states(ids, positions, mask, cache)
        prefix_mean = (hidden * mask[..., None]).sum(dim=1) / mask.sum(dim=1, keepdim=True)
        features = prefix_mean[:, :feature_dim].tolist()

        logits = self._project(hidden[:, -1])
        active = list(range(len(prefixes)))
        next_positions = positions[:, -1] + 1
        for step in range(max_new_tokens):
            step_logprobs = F.log_softmax(logits / (1.0 if greedy else temperature), dim=-1)
            if greedy:
                chosen = step_logprobs.argmax(dim=-1)
            else:
                draw_on = generator.device if generator is not None else step_logprobs.device
                chosen = torch.multinomial(step_logprobs.exp().to(draw_on), 1, generator=generator)
                chosen = chosen.squeeze(-1).to(step_logprobs.device)
            chosen_logprobs = step_logprobs.gather(-1, chosen[:, None]).squeeze(-1)
            still_active: list[int] = []
            step_tokens, step_token_logprobs = chosen.tolist(), chosen_logprobs.tolist()
            for row, (token, logprob) in enumerate(zip(step_tokens, step_token_logprobs, strict=True)):
                tokens[active[row]].append(token)
                logprobs[active[row]].append(logprob)
                if token != stop_id:
                    still_active.append(row)
            if step == max_new_tokens - 1 or not still_active:
                break
            if len(still_active) < len(active):
                rows = torch.tensor(still_active, device=self.device)
                cache.keep_rows(rows)
                chosen, next_positions = chosen[rows], next_positions[rows]
                active = [active[row] for row in still_active]
            new_mask = torch.ones_like(chosen, dtype=torch.bool)[:, None]
            logits = self.extend(chosen[:, None], next_positions[:, None], new_mask, cache)[:, -1]
            next_positions = next_positions + 1
        return Samples(tokens, logprobs, features)

    def _project(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.token_embedding.weight, self.output_bias)

    def _hidden_states(
        self, ids: Tensor, positions: Tensor | None, attention_mask: Tensor | None, cache: KVCache | None
    ) -> Tensor:
        batch, steps = ids.shape
        start = 0 if cache is None else cache.length
        if start + steps > (self.config.max_len if cache is None else cache.capacity):
            raise ValueError(f"{start + steps} tokens exceed the model's max_len or the cache's capacity")
        if positions is None:
            positions = torch.arange(steps, device=ids.device).expand(batch, steps)
        if attention_mask is None:
            attention_mask = torch.ones_like(ids, dtype=torch.bool)
        if cache is None:
            key_mask = attention_mask
        else:
            cache.key_mask[:, start : start + steps] = attention_mask
            key_mask = cache.key_mask[:, : start + steps]
        query_slots = torch.arange(start, start + steps, device=ids.device)[:, None]
        key_slots = torch.arange(start + steps, device=ids.device)[None, :]
        allowed = (key_slots <= query_slots) & (key_mask[:, None, :] | (key_slots == query_slots))
        allowed = allowed[:, None]  # one mask for every head
        x = self.token_embedding(ids) + self.position_embedding(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, allowed, cache, layer)
        if cache is not None:
            cache.length = start + steps
        out: Tensor = self.final_norm(x)
        return out


def left_pad(prefixes: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded ids [B,P] (PAD_ID before each prefix) and the bool mask of the real tokens."""
    longest = max(len(prefix) for prefix in prefixes)
    ids = torch.full((len(prefixes), longest), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(prefixes), longest, dtype=torch.bool)
    for row, prefix in enumerate(prefixes):
        ids[row, longest - len(prefix) :] = torch.tensor(prefix, dtype=torch.long)
        mask[row, longest - len(prefix) :] = True
    return ids.to(device), mask.to(device)


@torch.no_grad()
def sample_reference(
    model: TinyLM,
    prefixes: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_id: int,
    greedy: bool = True,
) -> list[list[int]]:
    """Greedy decoding by full recomputation, one sequence at a time, no cache and no padding: the exact
    answer `TinyLM.sample(..., greedy=True)` must reproduce. Only greedy decoding has one exact answer, so
    greedy=False is refused (the argument mirrors `TinyLM.sample`)."""
    if not greedy:
        raise ValueError("the reference decodes greedily only")
    generated: list[list[int]] = []
    for prefix in prefixes:
        sequence = list(prefix)
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([sequence], device=model.device))[0, -1]
            sequence.append(int(logits.argmax()))
            if sequence[-1] == stop_id:
                break
        generated.append(sequence[len(prefix) :])
    return generated
