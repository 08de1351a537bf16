"""The decode batch's key/value cache: left-padded rows in growable slabs.

Continuous batching keeps every running sequence in one batch. Rows have
different lengths, so they are left-padded to a shared width and an attention
mask marks the padding; each decode step appends one column for all rows.
Transformers' DynamicCache appends with `torch.cat`, copying the whole cache
every step; here each layer writes into a preallocated slab that grows by
doubling, so a step costs only the new column. Rows join (after their own
prefill) and leave (when finished) between steps.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache


class SlabLayer(CacheLayerMixin):
    """One layer's keys/values (B, H, capacity, D); the first `length` columns are live."""

    is_croppable = False

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, capacity: int | None = None, row_capacity: int = 0
    ) -> None:
        self.is_initialized = True
        self.device = keys.device
        self.rows, width = keys.shape[0], keys.shape[-2]
        capacity = max(capacity or 0, width, 16)
        shape = (max(row_capacity, self.rows), keys.shape[1], capacity, keys.shape[3])
        self._k = keys.new_zeros(shape)
        self._v = values.new_zeros(shape)
        self._k[: self.rows, :, :width] = keys
        self._v[: self.rows, :, :width] = values
        self.length = width

    # Transformers reads `.keys` / `.values` as the live cache.
    @property
    def keys(self) -> torch.Tensor:  # type: ignore[override]
        return self._k[: self.rows, :, : self.length]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:  # base-class __init__ assigns None
        pass

    @property
    def values(self) -> torch.Tensor:  # type: ignore[override]
        return self._v[: self.rows, :, : self.length]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        pass

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise AssertionError("SlabLayer is created initialized")

    def _reserve(self, width: int) -> None:
        capacity = self._k.shape[-2]
        if width <= capacity:
            return
        new_capacity = max(width, capacity * 2)
        shape = (*self._k.shape[:2], new_capacity, self._k.shape[3])
        k, v = self._k.new_zeros(shape), self._v.new_zeros(shape)
        k[: self.rows, :, : self.length] = self.keys
        v[: self.rows, :, : self.length] = self.values
        self._k, self._v = k, v

    def put(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write one sequence's keys/values (1, H, l, D) into row `slot`, right-aligned to the live
        width; the caller masks the columns before them. A slot past the rows in use adds a row."""
        n = keys.shape[-2]
        # the masked columns before it are zeroed: a slot past the rows in use holds whatever its
        # memory held, and masked scores of NaN keys would still be NaN
        self._k[slot, :, : self.length - n] = 0
        self._v[slot, :, : self.length - n] = 0
        self._k[slot, :, self.length - n : self.length] = keys[0]
        self._v[slot, :, self.length - n : self.length] = values[0]
        self.rows = max(self.rows, slot + 1)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        self._reserve(self.length + n)
        self._k[: self.rows, :, self.length : self.length + n] = key_states
        self._v[: self.rows, :, self.length : self.length + n] = value_states
        self.length += n
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1


class BatchKV:
    """Left-padded KV rows of the running batch plus their attention mask."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (B, width) long, 1 = real token

    @property
    def size(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def _layers(self) -> list[SlabLayer]:
        assert self.cache is not None
        return self.cache.layers  # type: ignore[return-value]

    def add(
        self, rows: list[list[tuple[torch.Tensor, torch.Tensor]]], keep: list[int] | None = None, row_capacity: int = 0
    ) -> None:
        """Append rows, each per layer (keys, values) of one prefilled sequence (1, H, l, D).

        `keep` names the existing rows to carry over (default: all); the rest are dropped
        in the same rebuild. The slabs get room for twice the rows they hold, at most
        `row_capacity`, so later rows can be `put` in place; a batch that outgrows that room is
        rebuilt (the room doubling each time). Room for the whole `row_capacity` up front would
        cost one sequence's keys/values times it at every width: 12 GB for a single
        4,000-token stream of the default model with 64 rows.
        """
        old_mask, old_layers = self.mask, (self._layers() if self.cache is not None else [])
        if old_mask is not None and keep is not None and len(keep) < old_mask.shape[0]:
            index = torch.tensor(keep, dtype=torch.long, device=old_mask.device)
            old_mask = old_mask.index_select(0, index) if keep else None
        else:
            index = None
        start = 0
        if old_mask is not None:
            live = torch.nonzero(old_mask.sum(0)).flatten()
            start = int(live[0]) if live.numel() else old_mask.shape[1]
            old_mask = old_mask[:, start:]
        lengths = [row[0][0].shape[-2] for row in rows]
        width = max([0 if old_mask is None else old_mask.shape[1], *lengths])
        held = len(rows) + (0 if old_mask is None else old_mask.shape[0])
        room = min(row_capacity, 2 * held)
        device = rows[0][0][0].device
        masks = [] if old_mask is None else [_pad_left(old_mask, width)]
        masks += [_pad_left(torch.ones(1, n, dtype=torch.long, device=device), width) for n in lengths]
        layers = []
        for i in range(len(rows[0])):
            ks, vs = [], []
            if old_mask is not None:
                k, v = old_layers[i].keys[:, :, start:], old_layers[i].values[:, :, start:]
                if index is not None:
                    k, v = k.index_select(0, index), v.index_select(0, index)
                ks.append(_pad_left(k, width))
                vs.append(_pad_left(v, width))
            for row in rows:
                ks.append(_pad_left(row[i][0], width))
                vs.append(_pad_left(row[i][1], width))
            layers.append(SlabLayer(torch.cat(ks), torch.cat(vs), capacity=width + 64, row_capacity=room))
        self.cache = DynamicCache()
        self.cache.layers = layers
        self.mask = torch.cat(masks)

    def put(self, rows: list[list[tuple[torch.Tensor, torch.Tensor]]], slots: list[int]) -> bool:
        """Write rows into `slots` in place: rows whose sequence has finished, or new rows at the
        end. Only when every row fits the live width and the slabs have room for the slots; else
        nothing is written and False says to rebuild (`add`)."""
        if self.cache is None or not rows:
            return False
        layers = self._layers()
        lengths = [row[0][0].shape[-2] for row in rows]
        size = max(self.size, max(slots) + 1)
        if max(lengths) > self.width or size > layers[0]._k.shape[0]:
            return False
        for i, layer in enumerate(layers):
            for slot, row in zip(slots, rows):
                layer.put(slot, *row[i])
        mask = self.mask
        if size > mask.shape[0]:
            mask = torch.cat([mask, mask.new_zeros(size - mask.shape[0], mask.shape[1])])
        for slot, n in zip(slots, lengths):
            mask[slot] = 0
            mask[slot, mask.shape[1] - n :] = 1
        self.mask = mask
        return True

    def leading_padding(self) -> int:
        """Columns at the start that are padding in every row (a `keep` of all rows drops them)."""
        if self.mask is None:
            return 0
        live = torch.nonzero(self.mask.sum(0)).flatten()
        return int(live[0]) if live.numel() else self.mask.shape[1]

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the batch), then drop all-padding columns."""
        if not rows:
            self.cache, self.mask = None, None
            return
        assert self.mask is not None
        index = torch.tensor(rows, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        live = torch.nonzero(mask.sum(0)).flatten()
        start = int(live[0]) if live.numel() else mask.shape[1]
        self.mask = mask[:, start:]
        for layer in self._layers():
            # same row and column room as before; rows past the kept ones are never read
            shape = (layer._k.shape[0], layer._k.shape[1], layer._k.shape[2] - start, layer._k.shape[3])
            k, v = layer._k.new_empty(shape), layer._v.new_empty(shape)
            k[: len(rows), :, : layer.length - start] = layer.keys.index_select(0, index)[:, :, start:]
            v[: len(rows), :, : layer.length - start] = layer.values.index_select(0, index)[:, :, start:]
            layer._k, layer._v = k, v
            layer.rows = len(rows)
            layer.length -= start

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask (B, width+1) and position ids (B, 1) for one decode step."""
        assert self.mask is not None
        ones = torch.ones(self.size, 1, dtype=self.mask.dtype, device=self.mask.device)
        mask = torch.cat([self.mask, ones], dim=1)
        positions = self.mask.sum(1, keepdim=True)
        return mask, positions

    def commit_step(self, mask: torch.Tensor) -> None:
        self.mask = mask


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad dim -2 (KV) or dim 1 (mask, 2-D) on the left up to `width`."""
    dim = 1 if t.dim() == 2 else -2
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
