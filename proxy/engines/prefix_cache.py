"""Prefix caching for the embedded engine: keys and values of token blocks seen before are reused.

Agents resend their whole history every turn, and every sample of a task repeats the same
system prompt and worked examples; recomputing that shared beginning is most of a prefill.
A prompt's blocks are kept at its prefill, and a finished request's prompt-and-reply blocks when
it ends (`ContinuousBatch._keep_reply`), so an agent's next turn, which is its previous prompt and
reply plus the new messages, computes only the new part. Sequences are cut into blocks of `BLOCK`
tokens, and each full block's keys/values are kept under (the block before it, its own tokens): a
trie, so a block is found only after exactly the same tokens before it, with no hashing and no
collisions. A new prompt reuses the longest chain of cached blocks that still leaves at least one of
its tokens to compute (the last position's logits start the sampling), and only the rest is prefilled.

Least recently used blocks are evicted first when the cache is over its token budget (a chain
is touched from its last block back to its first, so a shared beginning outlives the blocks
that hang off it). A weight update empties the cache: keys and values computed with the old
weights are not the new policy's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK = 16

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (1, heads, positions, dim)


@dataclass(eq=False)
class Block:
    id: int
    kv: KV  # per layer (1, heads, BLOCK, dim)


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        self.max_blocks = max(max_tokens // BLOCK, 0)
        self._blocks: OrderedDict[tuple[int, tuple[int, ...]], Block] = OrderedDict()
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        self._blocks.clear()

    def match(self, prompt: Sequence[int]) -> list[Block]:
        """The longest chain of cached blocks that begins `prompt` and leaves a token of it uncovered."""
        chain: list[tuple[tuple[int, tuple[int, ...]], Block]] = []
        parent = 0
        for b in range((len(prompt) - 1) // BLOCK):
            key = (parent, tuple(prompt[b * BLOCK : (b + 1) * BLOCK]))
            block = self._blocks.get(key)
            if block is None:
                break
            chain.append((key, block))
            parent = block.id
        for key, _ in reversed(chain):
            self._blocks.move_to_end(key)
        return [block for _, block in chain]

    def store(self, prompt: Sequence[int], kv: KV) -> None:
        """Keep every full block of `prompt` (a prompt, or a prompt and reply) not cached yet; `kv`
        holds its keys/values per layer."""
        if not self.max_blocks:
            return
        path = []
        parent = 0
        for b in range(len(prompt) // BLOCK):
            key = (parent, tuple(prompt[b * BLOCK : (b + 1) * BLOCK]))
            block = self._blocks.get(key)
            if block is None:
                cut = slice(b * BLOCK, (b + 1) * BLOCK)
                block = Block(self._next_id, [(k[:, :, cut].clone(), v[:, :, cut].clone()) for k, v in kv])
                self._next_id += 1
                self._blocks[key] = block
            path.append(key)
            parent = block.id
        for key in reversed(path):
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)


def past_of(chain: list[Block], rows: int) -> KV:
    """The keys/values of a chain of blocks, per layer, expanded over `rows` prompts (no copy)."""
    layers = len(chain[0].kv)
    out = []
    for layer in range(layers):
        k = torch.cat([b.kv[layer][0] for b in chain], dim=2)
        v = torch.cat([b.kv[layer][1] for b in chain], dim=2)
        out.append((k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)))
    return out
