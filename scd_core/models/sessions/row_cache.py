"""A pre-allocated KV cache whose rows each advance at their own pace.

Speculative decoding commits a different number of tokens per row and call.  Here
every layer keeps one key and one value tensor sized for the whole generation,
(rows, kv_heads, capacity, head_dim); row r holds `lengths[r]` valid slots.  A call
writes each row's new keys at that row's own offset and the attention mask hides
every slot past it, so rewinding a row only lowers its length: nothing is copied,
cropped or re-allocated, memory is fixed at `capacity` slots per row, and a call
stays one batched forward over the longest row's slots (a row behind it attends to
masked slots, never more than it would once it catches up).
"""

from __future__ import annotations

import copy
from typing import Callable, NamedTuple, Optional, Sequence, Union

import torch


def tree_layout(width: int, branches: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets (width,) and who-sees-whom (width, width) of `width` new tokens laid out as a chain of
    L = (width - 1) / branches + 1 tokens followed by branches - 1 chains of L - 1 tokens, each of which takes the
    place of the first chain's tokens 2..L (same positions) and sees the first chain's first token."""
    chain = (width - 1) // branches
    if branches < 1 or chain * branches != width - 1:
        raise ValueError(f"{width} tokens do not make {branches} chains branching after one shared token")
    index = torch.arange(width, device=device)
    branch = torch.where(index == 0, 0, (index - 1) // chain) if chain else torch.zeros_like(index)
    offset = torch.where(index == 0, 0, (index - 1) % chain + 1) if chain else index
    sees = (index.unsqueeze(1) >= index) & ((branch.unsqueeze(1) == branch) | (index == 0))
    return offset, sees


class LayerSlots(NamedTuple):
    """One layer's cache tensors and where this call writes: what a compiled layer takes as its arguments."""

    keys: torch.Tensor    # (rows, kv_heads, capacity, head_dim)
    values: torch.Tensor
    slots: torch.Tensor   # (rows, width) the slot of each new token
    key_len: int          # slots the call attends to (the whole capacity in static mode)

    def write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (rows, heads, width, dim) keys/values in place; returns the attended slots."""
        # index_put_, not scatter_: inductor writes it into the cache in place, while a compiled scatter_ into
        # an input rewrote the whole cache (3x the layer's time at the Janus-Pro-1B shape on a CPU)
        rows = torch.arange(k.shape[0], device=k.device)[:, None, None]
        heads = torch.arange(k.shape[1], device=k.device)[None, :, None]
        index = (rows, heads, self.slots[:, None, :])
        self.keys.index_put_(index, k)
        self.values.index_put_(index, v)
        return self.keys[:, :, :self.key_len], self.values[:, :, :self.key_len]


def left_padded(parts: Sequence[torch.Tensor], value: Union[int, bool] = 0) -> torch.Tensor:
    """(rows, width, ...) tensors of different widths stacked into one, each padded on the left with `value`."""
    width = max(part.shape[1] for part in parts)
    return torch.cat([torch.nn.functional.pad(part, (0, 0) * (part.dim() - 2) + (width - part.shape[1], 0),
                                              value=value) for part in parts])


def joined_call(live: RowCache, group: RowCache, live_inputs: torch.Tensor, group_inputs: torch.Tensor,
                order: torch.Tensor, run: Callable[[RowCache, torch.Tensor], torch.Tensor]
                ) -> tuple[RowCache, torch.Tensor]:
    """One call over the rows of `live` (fed `live_inputs` (rows, W, ...) after their cached slots) and of
    `group` (never written to, fed its prompts `group_inputs` (rows, P, ...)): the caches joined (`order`), every
    row fed max(W, P) inputs, the shorter ones padded on the right, and the padding rewound after the call, so each
    row holds what it would after a call of its own.  `run(cache, inputs)` is the forward; returns (the joined
    cache, its output, rows in `order`)."""
    width = max(live_inputs.shape[1], group_inputs.shape[1])
    right = lambda inputs: torch.nn.functional.pad(inputs, (0, 0) * (inputs.dim() - 2) + (0, width - inputs.shape[1]))
    cache = RowCache.joined([live, group], order)
    output = run(cache, torch.cat([right(live_inputs), right(group_inputs)])[order])
    padding = [torch.full((inputs.shape[0],), width - inputs.shape[1], dtype=torch.long)
               for inputs in (live_inputs, group_inputs)]
    cache.rewind(torch.cat(padding).to(order.device)[order])
    return cache, output


def row_order(batch: int, added: int, copies: int, device: torch.device) -> torch.Tensor:
    """Where the rows of a cache of `batch` samples with `copies` rows each (every sample's first row, then every
    sample's second, e.g. cond then uncond rows) followed by one of `added` samples go when the two become one:
    each copy's old rows, then its new rows."""
    old, new = torch.arange(batch), copies * batch + torch.arange(added)
    return torch.cat([torch.cat([old + copy * batch, new + copy * added]) for copy in range(copies)]).to(device)


class RowCache:
    """Keys/values of `rows` sequences of at most `capacity` slots, the first `prefix` never rewound.

    `real` (rows, prefix) marks the prefix slots that may be attended (False at
    left padding); every later slot is real, and `pads` (rows, 1) counts each row's
    padding (families whose padding takes no position subtract it from the slots).
    Call `begin(width)` once per forward, then `write(layer, k, v)` in each layer.

    Static mode (`static = True`, for compiled and graph-captured calls): every call attends to the whole
    capacity with the mask built on the device from `lengths`, so a call's shapes depend on its width only;
    the cache never grows (trees are refused) and rewinding never reads the device.  `lengths` (updated in
    place) is then the only truth: `shortest` / `longest` hold the prefill's length only.

    `full_keys` (bfloat16 / float16 sessions, scd_core.compiled.invariant): every call attends to the whole
    capacity, masked, as in static mode, so the key length never depends on the call; all else stays eager.
    Such a cache is laid out by its job's own prompt alone (`row_session.RowSession.prefill`): `lead` hidden slots
    before the prompt round its slots up to the session's bucket, so that a job's keys sit at the same slots, and
    its calls attend over the same key length, alone and in any stream; `joined` then never moves a row, as
    `admit` joins only jobs of one layout (the attention reduces a row's keys in groups that follow their slots).
    """

    # what depends on the prompt's length and no static call reads (it reads `last_slot` and `lengths`): a kept
    # CUDA graph serves any prompt of its cache's size (scd_core.compiled.graph_state)
    per_generation = frozenset({"prefix", "end", "shortest", "longest", "_slots"})

    def __init__(self, rows: int, capacity: int, prefix: int, device: torch.device,
                 real: Optional[torch.Tensor] = None, spare: int = 0, lead: int = 0) -> None:
        """`spare` of the `capacity` slots, the last ones, are never written or attended: they give a compiled
        run's shapes room for longer prompts (`row_session.PROMPT_BUCKET`).  `lead` slots, the first ones, are
        hidden and never written either (rows start after them): the prompt `real` (rows, width) follows them."""
        self.capacity, self.prefix, self.end, self.lead = capacity, prefix, capacity - spare, lead
        self.lengths = torch.full((rows,), lead, dtype=torch.long, device=device)
        # host copies of the shortest and longest row: size the call without reading the device
        self.shortest = self.longest = lead
        self.real = torch.ones(rows, capacity, dtype=torch.bool, device=device)
        self.real[:, :lead] = False
        if real is not None:
            self.real[:, lead:lead + real.shape[1]] = real.to(device=device, dtype=torch.bool)
        self.real[:, self.end:] = False
        self.pads = (~self.real[:, :prefix]).sum(dim=1, keepdim=True)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._slots = torch.zeros(rows, 0, dtype=torch.long, device=device)
        self.last_slot = torch.tensor(self.end - 1, device=device)  # as static calls read `end - 1` (never grown)
        self._key_len = 0
        self.static = False
        self.full_keys = False  # every call attends to the whole capacity (scd_core.compiled.invariant)

    @property
    def written(self) -> bool:
        """Whether a call has fed the cache (its prefill)."""
        return self.longest > self.lead

    def allocate(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Allocate every layer's tensors now (else the first `write` of each layer does)."""
        shape = (self.lengths.shape[0], kv_heads, self.capacity, head_dim)
        device = self.lengths.device
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def take_memory(self, other: "RowCache") -> bool:
        """Use `other`'s layer tensors, zeroed, as this static cache's (before its first call allocates them), where
        they have its size: a kept generation's, whose CUDA graphs read them (`cuda_graphs.KeptGraphs.take`).  Whether
        it did."""
        same_size = (other.lengths.shape, other.capacity, other.lengths.device) == (
            self.lengths.shape, self.capacity, self.lengths.device)
        if not (self.static and other.static and same_size and other.keys and not self.keys):
            return False
        self.keys = [tensor.zero_() for tensor in other.keys]
        self.values = [tensor.zero_() for tensor in other.values]
        return True

    def layer(self, index: int) -> LayerSlots:
        """Layer `index`'s tensors and this call's slots (after `begin` and `allocate`)."""
        return LayerSlots(self.keys[index], self.values[index], self._slots, self._key_len)

    def begin(self, width: int, branches: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `width` slots to every row; returns (positions (rows, width), visible (rows, width, keys)).

        `visible[r, t, s]` says whether row r's new token t attends to key slot s:
        causal over the row's own slots, left padding hidden; a padding query sees
        itself so that no query row is fully masked.  With `branches` = k > 1 the new
        tokens are a tree (`tree_layout`): a chain of L tokens, then k - 1 chains of
        L - 1 that branch off after its first token, each seeing that token and itself.
        """
        if self.static and branches > 1:
            raise ValueError("a static-shape cache takes no candidate trees (they would grow it); "
                             "use candidates=1 with a compiled model")
        if not self.static and branches > 1 and self.longest + width > self.capacity:
            self._grow(self.longest + width)
        if not self.static and self.shortest + width > self.capacity:
            raise ValueError(f"feeding {width} tokens would pass the {self.capacity - self.prefix} cached positions "
                             f"(a row already holds {self.shortest - self.prefix})")
        device = self.lengths.device
        offset, sees = tree_layout(width, branches, device)
        slots = self.lengths.unsqueeze(1) + torch.arange(width, device=device)
        # A faster row may run past the end while a slower one finishes; those tokens only yield logits
        # of positions past the last, so they share the last slot.
        self._slots = torch.minimum(slots, self.last_slot) if self.static else slots.clamp(max=self.end - 1)
        self._key_len = self.capacity if self.static or self.full_keys else min(self.longest + width, self.capacity)
        keys = torch.arange(self._key_len, device=device)
        new = keys - self.lengths.unsqueeze(1)  # (rows, keys): index among this call's tokens, < 0 if cached
        cached = (new < 0).unsqueeze(1) & self.real[:, None, :self._key_len]
        among_new = sees[:, new.clamp(0, width - 1)].transpose(0, 1) & (new < width).unsqueeze(1)
        padding = ~self.real[:, None, :self._key_len]  # only in the prefill: a padded query sees itself only
        itself = new.unsqueeze(1) == torch.arange(width, device=device).view(1, -1, 1)
        visible = cached | (among_new & (~padding | itself) & (new >= 0).unsqueeze(1))
        self.lengths += width  # in place: a captured graph reads this tensor
        if not self.static or not self.longest:  # static: the host counts stop after the prefill, so a traced
            self.shortest += width               # call never specialises on them
            self.longest += width
        return self.lengths.unsqueeze(1) - width + offset, visible

    def _grow(self, capacity: int) -> None:
        """Make room for `capacity` slots per row: a tree near the end holds more tokens than the positions left
        (its chains repeat positions), and the slots of a tree must not share the last one."""
        extra = capacity - self.capacity
        self.real = torch.nn.functional.pad(self.real, (0, extra), value=True)
        for store in (self.keys, self.values):
            store[:] = [torch.nn.functional.pad(tensor, (0, 0, 0, extra)) for tensor in store]
        self.capacity = self.end = capacity

    def keep_branch(self, branch: torch.Tensor, width: int, branches: int) -> None:
        """After a `branches`-tree call of `width` tokens: each row keeps the chain `branch[r]` (0 = the first)
        in place of the first chain's, by copying its slots there; rewind then drops what is not kept."""
        chain = (width - 1) // branches  # tokens after the shared first one, in every chain
        start = self.lengths - width + 1  # the first chain's second slot, per row
        source = torch.where(branch > 0, start + chain + (branch - 1) * chain, start)
        steps = torch.arange(chain, device=self.lengths.device)
        source, target = source.unsqueeze(1) + steps, start.unsqueeze(1) + steps
        for store in (self.keys, self.values):
            for tensor in store:
                index = lambda slots: slots[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
                tensor.scatter_(2, index(target), tensor.gather(2, index(source)))

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (rows, heads, width, dim) keys/values of this call; returns the attended slots of the layer."""
        if layer == len(self.keys):  # allocated on the first call, when heads, dim and dtype are known
            shape = (k.shape[0], k.shape[1], self.capacity, k.shape[3])
            self.keys.append(torch.zeros(shape, dtype=k.dtype, device=k.device))
            self.values.append(torch.zeros(shape, dtype=v.dtype, device=v.device))
        return self.layer(layer).write(k, v)

    def view(self, rows: slice) -> "RowCache":
        """Rows `rows` as a cache of their own that shares this one's tensors (allocated first, `allocate`): a call
        over the view writes into these rows and moves their lengths, the other rows stay as they are; `recount`
        this cache after."""
        view = copy.copy(self)
        view.lengths, view.real, view.pads = self.lengths[rows], self.real[rows], self.pads[rows]
        view.keys, view.values = [k[rows] for k in self.keys], [v[rows] for v in self.values]
        view.recount()
        return view

    def recount(self) -> None:
        """The host copies of the shortest and longest row read again (after a call over a `view`)."""
        self.shortest, self.longest = torch.stack([self.lengths.min(), self.lengths.max()]).tolist()

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep rows `index` (in that order) and drop the others, e.g. those of finished samples."""
        self.lengths, self.real, self.pads = self.lengths[index], self.real[index], self.pads[index]
        self._slots = self._slots[index]
        self.keys = [k[index] for k in self.keys]
        self.values = [v[index] for v in self.values]
        self.shortest, self.longest = torch.stack([self.lengths.min(), self.lengths.max()]).tolist()

    @classmethod
    def joined(cls, caches: Sequence["RowCache"], order: torch.Tensor) -> "RowCache":
        """One cache of the rows of `caches`, rows `order` of their concatenation (at least one written to; one
        never written to gets zero slots, e.g. rows whose prompts the next call feeds).  Rows whose prefix is
        narrower are left-padded to the widest (hidden slots, counted in `pads`), so every row's prefix ends at
        one slot; capacity is the widest prefix plus the most later slots.  Caches of one prefix and capacity (one
        key layout: every `full_keys` cache `admit` joins) keep every row at its slots."""
        prefix = max(cache.prefix for cache in caches)
        capacity = prefix + max(cache.capacity - cache.prefix for cache in caches)
        joined = cls.__new__(cls)
        joined.capacity, joined.prefix, joined.end = capacity, prefix, capacity
        shifts = [(prefix - cache.prefix, capacity - prefix - (cache.capacity - cache.prefix)) for cache in caches]
        joined.lead = min(cache.lead + left for cache, (left, _) in zip(caches, shifts))
        pick = lambda parts: torch.cat(parts)[order]
        joined.lengths = pick([cache.lengths + left for cache, (left, _) in zip(caches, shifts)])
        joined.pads = pick([cache.pads + left for cache, (left, _) in zip(caches, shifts)])
        pad = torch.nn.functional.pad
        joined.real = pick([pad(pad(cache.real, (left, 0), value=False), (0, right), value=True)
                            for cache, (left, right) in zip(caches, shifts)])
        written = next(cache for cache in caches if cache.keys)
        for name in ("keys", "values"):
            layers = [getattr(cache, name) or [torch.zeros(cache.lengths.shape[0], *tensor.shape[1:2],
                                                           cache.capacity, *tensor.shape[3:], dtype=tensor.dtype,
                                                           device=tensor.device) for tensor in getattr(written, name)]
                      for cache in caches]
            setattr(joined, name, [pick([pad(tensor, (0, 0, left, right)) for tensor, (left, right)
                                         in zip(layer, shifts)]) for layer in zip(*layers)])
        joined._slots = torch.zeros(order.numel(), 0, dtype=torch.long, device=order.device)
        joined._key_len = 0
        joined.static = False  # a stream's caches grow and shrink; compiled models run no streams
        joined.full_keys = any(cache.full_keys for cache in caches)
        joined.shortest, joined.longest = torch.stack([joined.lengths.min(), joined.lengths.max()]).tolist()
        return joined

    def rewind(self, n: Union[int, torch.Tensor]) -> None:
        """Drop the last n slots of every row (an int) or of each row (a (rows,) tensor)."""
        if self.static:  # no check: it would read the device; the engine rewinds only what it fed
            self.lengths -= n.to(self.lengths.device) if isinstance(n, torch.Tensor) else int(n)
            return
        if isinstance(n, torch.Tensor) and n.dim() > 0:
            n = n.to(self.lengths.device)
            kept = self.lengths - n
            # one read-back, right after the engine's own synchronisation: the device is idle here
            bad, shortest, longest = torch.stack(
                [((n < 0) | (kept < self.prefix)).any().long(), kept.min(), kept.max()]).tolist()
            if bad:
                raise ValueError(f"cannot rewind {n.tolist()} tokens per row; "
                                 f"{(self.lengths - self.prefix).tolist()} are cached")
            self.lengths.copy_(kept)  # in place: a `view`'s lengths are these rows'
            self.shortest, self.longest = shortest, longest
            return
        n = int(n)
        if not 0 <= n <= self.shortest - self.prefix:
            raise ValueError(f"cannot rewind {n} tokens; {self.shortest - self.prefix} are cached")
        self.lengths -= n
        self.shortest -= n
        self.longest -= n
