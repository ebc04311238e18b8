"""BatchState: one model's view of many sequences (rows) in one KV cache, one forward for all.

`ModelState` owns one clip's tokens + cache + M-RoPE offset. `BatchState` owns the same three
things for several rows at once, keyed by any hashable (a clip path, a session id), with the same
verbs, per row:

* `join(key, inputs, tokens, keep)` — a new row: its prompt (with the audio) and any tokens after
  it run in a forward of their own and the resulting cache row is inserted into the batch's
  cache. (`start` + first `advance` of ModelState, in one call; `join_many` for several rows in
  one padded forward.)
* `advance({key: tokens}, keep)`  — one forward in which every row named gets its own number of
  tokens (rows not named get none); per-row logits back.
* `rollback(key, length)`         — cut one row back, the others untouched.
* `leave(key)`                    — the row's slot in the batch is freed.
* `adopt({key: state})` / `release({key: state})` — rows borrowed from single-sequence
  `ModelState`s whose prompt has run (a server's sessions between requests): the states lend
  their caches (`ModelState.lend`, one copy into the batch) and get them back, each row's columns
  gathered into a cache of its own (`ModelState.take_back`, one copy). Only the sequences being
  worked on are rows of the forward; each cache has one owner at a time.

How rows of different lengths share one cache. `DynamicCache` holds one tensor per layer,
[B, heads, L, head_dim], with one physical length L for all rows. Each row records which physical
slots (columns) hold its tokens, in order (`Row.slots`); the others are holes, which a [B, L]
boolean mask (`self.valid`) marks and every forward passes as its 2-D attention mask. Keys are
stored already rotated, so a token's position is fixed when it is written: each row gets its own
*logical* positions (its token count + its rope_deltas, the 3-D M-RoPE ids the thinker expects)
through explicit `position_ids`, whatever physical column the token lands in, while the causal
mask the model builds from the physical columns stays right because a row's tokens are always
appended after everything the cache holds. So:

* advance: the forward has n = the most tokens any row is given; a row given fewer is padded with
  `pad_id`, and its padding columns are holes from the start (their keys are garbage that no one
  attends to; their logits are never read). Only the logits rows asked for are computed: a pre-hook
  on the output embedding hands it exactly those hidden states ([1, M, hidden]), as
  `state.logits_for_last` does for one row.
* rollback: the row's slots after `length` become holes. Then the columns that are holes in every
  row at the end of the cache are cropped (`DynamicCache.crop`); holes in the middle stay until
  they waste more than `max_waste` columns, when the cache is compacted: each row's slots gathered
  to the front (left-aligned, holes at the right of the shorter rows), one gather per layer.
* join: the new row's prefill runs as `ModelState._first_forward` runs it (the prompt with its
  audio through the tower, M-RoPE positions and rope_deltas from `get_rope_index` over the row's
  own tokens), in a forward of its own, so its cache row is bit-identical to its batch-1 run's
  (tested). Its tensors are then padded to the cache's length (or the cache to the row's) and
  concatenated on the batch dimension. Why one forward per joining clip: on 2 CPU cores the
  prefill is compute-bound (a prompt of 100-450 tokens, the audio tower over ~1,000 mel frames),
  and 8 prefills in one right-padded forward cost the demo cloud 399-578 ms of CPU against 297 ms
  one by one (padding, and the masked attention path). `join_many` does batch them (rows
  right-padded, the audio of all rows through the tower together: its valid frames are what it
  reads), for accelerators, where a forward's cost is mostly its launch; `batch_loop` uses it with
  `batch_prefill=True`. A lazily prefilled cloud row joins in the middle of other rows' blocks
  either way.
* leave: `DynamicCache.batch_select_indices` keeps the other rows.

Invariant, asserted per row after every change: the row's valid columns == its slots == its tokens.

Numerics: a row's logits in a batched forward differ from its batch-1 forward by float rounding only
(different matmul shapes, masked columns contribute exact zeros); greedy decoding can then differ
only at a near-tie (tests/test_batch_state.py, tests/test_batch_loop.py).

Only `DynamicLayer` caches (full attention) are handled: a sliding-window layer drops columns on
its own, which the slot bookkeeping cannot follow, so such a model is refused at join.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from .state import Lent, ModelState


@dataclass
class Row:
    """One sequence of the batch: what ModelState holds for one clip, plus its slots."""

    ids: list[int]                     # tokens the cache holds for this row (prompt first)
    slots: list[int]                   # physical cache column of each token, increasing
    prompt_ids: list[int]
    delta: int = 0                     # int(rope_deltas) of the row's prompt
    last_logits: torch.Tensor | None = None  # (V,) prediction after ids[-1]; None after a cut
    # Work counters, as ModelState's (a forward counts for a row only when it fed the row tokens).
    prefill_tokens: int = 0
    forwards: int = 0
    tokens_fed: int = 0
    all_forwards: int = 0
    name: str = field(default="row", repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    def pending(self, sequence: Sequence[int]) -> list[int]:
        """Tokens of `sequence` this row has not consumed; the held tokens must prefix it."""
        n = len(self.ids)
        assert len(sequence) >= n and list(sequence[:n]) == self.ids, (
            f"{self.name}: cache holds tokens that are not a prefix of the accepted sequence"
        )
        return list(sequence[n:])


@contextlib.contextmanager
def _logits_at(model: torch.nn.Module, rows: torch.Tensor, cols: torch.Tensor) -> Iterator[bool]:
    """Make the next forward compute logits only at (rows[i], cols[i]) of its [B, n] positions,
    returned as out.logits [1, M, V]. Yields whether the hook is in place (models without an output
    embedding compute every position; the caller then indexes)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None:
        yield False
        return
    handle = head.register_forward_pre_hook(lambda _m, args: (args[0][rows, cols][None], *args[1:]))
    try:
        yield True
    finally:
        handle.remove()


class BatchState:
    def __init__(self, model: PreTrainedModel, name: str = "model", pad_id: int = 0, max_waste: int = 64) -> None:
        self.model = model
        self.name = name
        self.pad_id = pad_id          # fed in padding columns: never attended to, never read
        self.max_waste = max_waste    # hole columns tolerated before the cache is compacted
        self.device = model.device
        self.cache: DynamicCache | None = None
        self.order: list[Hashable] = []  # batch index -> key
        self.rows: dict[Hashable, Row] = {}
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [B, L]: column holds a token
        self._mrope = hasattr(getattr(model, "model", None), "get_rope_index")
        cfg = getattr(model, "config", None)
        # Token ids the thinker replaces by audio/image/video features (see ModelState).
        self._placeholders = {getattr(cfg, a) for a in ("audio_token_id", "image_token_id", "video_token_id")
                              if isinstance(getattr(cfg, a, None), int)}

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.rows

    def __getitem__(self, key: Hashable) -> Row:
        return self.rows[key]

    @property
    def width(self) -> int:
        """Physical columns of the cache (the longest row plus holes)."""
        return self.valid.shape[1]

    # -- the ways the state changes -------------------------------------------------------------

    def join(self, key: Hashable, inputs: Mapping[str, torch.Tensor], tokens: Sequence[int] | None = None,
             keep: int = 1) -> torch.Tensor:
        """Add one row: `join_many` of one."""
        return self.join_many({key: (inputs, tokens, keep)})[key]

    @torch.inference_mode()
    def join_many(self, joins: Mapping[Hashable, tuple[Mapping[str, torch.Tensor], Sequence[int] | None, int]]
                  ) -> dict[Hashable, torch.Tensor]:
        """Add rows, key -> (thinker inputs, tokens, keep): each row's prompt (with its audio) and
        the tokens after it (`tokens` must start with the prompt; the prompt alone when None) run in
        one forward of their own, the joining rows right-padded to the longest, their audio through
        the audio tower together; the new cache rows are then inserted. Per row, [keep, V] logits
        for its last `keep` tokens, as ModelState.advance returns them."""
        plan: dict[Hashable, tuple[list[int], list[int], int]] = {}  # key -> (prompt, tokens, keep)
        after: dict[Hashable, tuple[list[int], int]] = {}            # key -> (extra, keep) fed afterwards
        for key, (inputs, tokens, keep) in joins.items():
            assert key not in self.rows and key not in plan, f"{self.name}: row {key!r} is in the batch already"
            prompt = inputs["input_ids"][0].tolist()  # input_ids: [1, P]
            assert inputs["input_ids"].shape[0] == 1, "one clip per row"
            tokens = prompt if tokens is None else [int(t) for t in tokens]
            assert tokens[:len(prompt)] == prompt, f"{self.name}: a joining row must start with its prompt"
            extra = tokens[len(prompt):]
            assert 0 < keep <= len(tokens), f"{self.name}: cannot keep {keep} of {len(tokens)} rows"
            if self._placeholders.intersection(extra):
                # An answer token equal to a placeholder id (rules off only) would be taken for audio in
                # the prompt's forward: the prompt joins alone, the rest follows (as ModelState does).
                plan[key] = (prompt, prompt, max(1, keep - len(extra)))
                after[key] = (extra, keep)
            else:
                plan[key] = (prompt, tokens, keep)
        logits = self._prefill(plan, joins)
        for key, (extra, keep) in after.items():
            tail = self.advance({key: extra}, {key: min(keep, len(extra))})[key]
            logits[key] = torch.cat([logits[key], tail])[-keep:]
        return logits

    def _prefill(self, plan: Mapping[Hashable, tuple[list[int], list[int], int]],
                 joins: Mapping[Hashable, tuple]) -> dict[Hashable, torch.Tensor]:
        """The joining rows' forward, as ModelState._first_forward does it for one row: M-RoPE
        positions from `get_rope_index` over each row's tokens (rope_deltas per row), audio
        features of all rows stacked (their valid frames are what the audio tower reads)."""
        keys = list(plan)
        j = len(keys)
        longest = max(len(plan[key][1]) for key in keys)
        input_ids = torch.full((j, longest), self.pad_id, dtype=torch.long)  # [J, P]: right-padded
        mask = torch.zeros(j, longest, dtype=torch.long)                        # [J, P]
        positions = torch.zeros(3, j, longest, dtype=torch.long)                # [3, J, P]
        deltas = [0] * j
        for i, key in enumerate(keys):
            tokens = plan[key][1]
            n = len(tokens)
            input_ids[i, :n] = torch.tensor(tokens)
            mask[i, :n] = 1
            if self._mrope:
                fmask = joins[key][0].get("feature_attention_mask")
                pos, delta = self.model.model.get_rope_index(
                    input_ids[i:i + 1, :n].to(self.device), None, None, mask[i:i + 1, :n].to(self.device), False,
                    fmask.sum(-1) if fmask is not None else None, None)
                positions[:, i, :n] = pos[:, 0].cpu()
                positions[:, i, n:] = pos[:, 0, -1:].cpu() + torch.arange(1, longest - n + 1)  # padding: never read
                deltas[i] = int(delta.view(-1)[0])
            else:
                positions[:, i] = torch.arange(longest)
        kwargs: dict = dict(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device))
        kwargs["position_ids"] = positions.to(self.device) if self._mrope else positions[0].to(self.device)
        feats = [joins[key][0].get("input_features") for key in keys]
        if any(f is not None for f in feats):
            assert all(f is not None for f in feats), f"{self.name}: joining rows must all have audio or none"
            frames = max(f.shape[-1] for f in feats)
            kwargs["input_features"] = torch.cat([_pad_last(f, frames) for f in feats])  # [J, mels, T]
            kwargs["feature_attention_mask"] = torch.cat(
                [_pad_last(joins[key][0]["feature_attention_mask"], frames) for key in keys])  # [J, T]
        want_rows, want_cols, spans = [], [], {}
        for i, key in enumerate(keys):
            n, keep = len(plan[key][1]), plan[key][2]
            spans[key] = (len(want_rows), keep)
            want_rows.extend([i] * keep)
            want_cols.extend(range(n - keep, n))
        rows_t, cols_t = torch.tensor(want_rows, device=self.device), torch.tensor(want_cols, device=self.device)
        cache = DynamicCache()
        with _logits_at(self.model, rows_t, cols_t) as hooked:
            out = self.model(**kwargs, past_key_values=cache, use_cache=True)
        logits = (out.logits[0] if hooked else out.logits[rows_t, cols_t]).float().cpu()  # [M, V]
        assert all(type(layer) is DynamicLayer for layer in cache.layers), (
            f"{self.name}: only full-attention caches can be batched (a sliding window drops columns)")
        self._insert(cache, mask.bool().to(self.device))
        result = {}
        for i, key in enumerate(keys):
            prompt, tokens, _ = plan[key]
            at, keep = spans[key]
            result[key] = logits[at:at + keep]
            extra = len(tokens) - len(prompt)
            self.order.append(key)
            self.rows[key] = Row(list(tokens), list(range(len(tokens))), prompt, deltas[i], result[key][-1],
                                 prefill_tokens=len(prompt), forwards=int(extra > 0), tokens_fed=extra,
                                 all_forwards=1, name=f"{self.name}[{key}]")
        self._tidy()
        self._check()
        return result

    def _insert(self, cache: DynamicCache, valid: torch.Tensor) -> None:
        """Append the rows of `cache` ([J, H, P, D] per layer; `valid` [J, P]) to the batch."""
        if self.cache is None:
            self.cache, self.valid = cache, valid
            return
        width = max(self.width, valid.shape[1])
        self._pad_columns(width)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([mine.keys, _pad_seq(theirs.keys, width)])
            mine.values = torch.cat([mine.values, _pad_seq(theirs.values, width)])
        self.valid = torch.cat([self.valid, _pad_last(valid, width)])

    @torch.inference_mode()
    def advance(self, feed: Mapping[Hashable, Sequence[int]],
                keep: Mapping[Hashable, int] | None = None) -> dict[Hashable, torch.Tensor]:
        """One forward: each row in `feed` gets its tokens after the ones it holds (rows not in
        `feed`, or given none, get nothing). Returns, per row fed, [keep, V] float logits on the CPU
        for its last `keep` tokens (all when `keep` does not name the row), row i predicting the
        token after its token."""
        feed = {key: [int(t) for t in tokens] for key, tokens in feed.items() if len(tokens)}
        if not feed:
            return {}
        b, width = len(self.order), self.width
        n = max(len(t) for t in feed.values())
        index = {key: i for i, key in enumerate(self.order)}
        input_ids = torch.full((b, n), self.pad_id, dtype=torch.long)      # [B, n]
        new_valid = torch.zeros(b, n, dtype=torch.bool)                      # [B, n]
        start = torch.zeros(b, dtype=torch.long)                             # [B]: first logical position
        want_rows: list[int] = []
        want_cols: list[int] = []
        spans: dict[Hashable, tuple[int, int]] = {}
        for key, tokens in feed.items():
            i, row, m = index[key], self.rows[key], len(tokens)
            input_ids[i, :m] = torch.tensor(tokens)
            new_valid[i, :m] = True
            k = m if keep is None or key not in keep else keep[key]
            assert 0 < k <= m, f"{row.name}: cannot keep {k} of {m} rows"
            spans[key] = (len(want_rows), k)
            want_rows.extend([i] * k)
            want_cols.extend(range(m - k, m))
        for i, key in enumerate(self.order):
            row = self.rows[key]
            start[i] = len(row.ids) + (row.delta if self._mrope else 0)
        positions = start[:, None] + torch.arange(n)[None, :]                # [B, n]
        positions = positions[None].expand(3, b, n) if self._mrope else positions  # [3, B, n]: M-RoPE
        new_valid = new_valid.to(self.device)
        mask = torch.cat([self.valid, new_valid], dim=1)                     # [B, L + n]
        rows_t = torch.tensor(want_rows, device=self.device)
        cols_t = torch.tensor(want_cols, device=self.device)
        with _logits_at(self.model, rows_t, cols_t) as hooked:
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.long(),
                             position_ids=positions.to(self.device), past_key_values=self.cache, use_cache=True)
        logits = out.logits[0] if hooked else out.logits[rows_t, cols_t]    # [M, V]
        logits = logits.float().cpu()
        self.valid = mask
        result: dict[Hashable, torch.Tensor] = {}
        for key, tokens in feed.items():
            row, (at, k) = self.rows[key], spans[key]
            row.slots.extend(range(width, width + len(tokens)))
            row.ids.extend(tokens)
            row.forwards += 1
            row.all_forwards += 1
            row.tokens_fed += len(tokens)
            result[key] = logits[at:at + k]
            row.last_logits = result[key][-1]
        self._tidy()
        self._check()
        return result

    @torch.inference_mode()
    def rollback(self, key: Hashable, length: int) -> None:
        """Cut one row back to its first `length` tokens (never into the prompt)."""
        row = self.rows[key]
        remove = len(row.ids) - length
        assert 0 <= remove, f"{row.name}: cannot roll forward from {len(row.ids)} to {length}"
        assert not remove or length >= len(row.prompt_ids), f"{row.name}: cannot cut into the prompt"
        if remove:
            i = self.order.index(key)
            self.valid[i, row.slots[length:]] = False
            del row.slots[length:]
            del row.ids[length:]
            row.last_logits = None
            self._tidy()
        self._check()

    @torch.inference_mode()
    def leave(self, key: Hashable) -> Row:
        """Drop a row from the batch; returns its last state (counters included)."""
        row = self.rows[key]
        self._drop([key])
        return row

    @torch.inference_mode()
    def adopt(self, states: Mapping[Hashable, ModelState]) -> None:
        """Rows from single-sequence states whose prompt has run, without a forward: each state
        lends its cache, tokens, rope offset, kept logits and counters (`ModelState.lend`) and the
        batch owns them until `release`. A server verifying a few of its sessions at once makes
        only those sessions rows of the forward; the others keep their caches on their own (an
        idle row would cost every forward a padded row). Costs one copy of the adopted caches."""
        if not states:
            return
        lent: dict[Hashable, Lent] = {}
        for key, state in states.items():
            assert key not in self.rows, f"{self.name}: row {key!r} is in the batch already"
            lent[key] = state.lend()
            assert all(type(layer) is DynamicLayer for layer in lent[key].cache.layers), (
                f"{self.name}: only full-attention caches can be batched (a sliding window drops columns)")
        width = max(len(got.ids) for got in lent.values())
        pairs = []
        for per_row in zip(*(got.cache.layers for got in lent.values()), strict=True):
            # [J, H, width, D]: each row's columns first, holes after (as a joining row's)
            _, h, _, d = per_row[0].keys.shape
            keys = per_row[0].keys.new_zeros(len(per_row), h, width, d)
            values = torch.zeros_like(keys)
            for i, layer in enumerate(per_row):
                keys[i, :, :layer.keys.shape[2]] = layer.keys[0]
                values[i, :, :layer.values.shape[2]] = layer.values[0]
            pairs.append((keys, values))
        valid = torch.zeros(len(lent), width, dtype=torch.bool, device=self.device)  # [J, width]
        for i, (key, got) in enumerate(lent.items()):
            n = len(got.ids)
            valid[i, :n] = True
            self.order.append(key)
            self.rows[key] = Row(list(got.ids), list(range(n)), list(states[key].prompt_ids), got.delta,
                                 got.last_logits, got.prefill_tokens, got.forwards, got.tokens_fed,
                                 got.all_forwards, name=f"{self.name}[{key}]")
        self._insert(_cache_of(pairs), valid)
        self._check()

    @torch.inference_mode()
    def release(self, states: Mapping[Hashable, ModelState]) -> None:
        """Rows leave the batch and each `states[key]` owns its row again (`ModelState.take_back`):
        the row's columns gathered into a cache of its own, [1, H, len(ids), D] per layer, with its
        rope offset, kept logits and counters. A row that joined here (its prompt ran in this batch)
        is owned by its state for the first time. The rows not named stay."""
        keys = list(states)
        for key in keys:
            row = self.rows[key]
            i = self.order.index(key)
            slots = torch.tensor(row.slots, device=self.device)
            own = _cache_of([(layer.keys[i:i + 1].index_select(2, slots), layer.values[i:i + 1].index_select(2, slots))
                             for layer in self.cache.layers])
            states[key].take_back(Lent(own, row.ids, row.delta, row.last_logits, row.prefill_tokens,
                                       row.forwards, row.tokens_fed, row.all_forwards))
        self._drop(keys)

    # -- internals ------------------------------------------------------------------------------

    def _drop(self, keys: Sequence[Hashable]) -> None:
        """Rows out of the batch: one selection of the others per layer (none when none stay)."""
        gone = set(keys)
        keep = [i for i, key in enumerate(self.order) if key not in gone]
        for key in keys:
            del self.rows[key]
        self.order = [self.order[i] for i in keep]
        if not keep:
            self.cache, self.valid = None, torch.zeros(0, 0, dtype=torch.bool, device=self.device)
            return
        self.cache.batch_select_indices(torch.tensor(keep, device=self.device))
        self.valid = self.valid[keep]
        self._tidy()
        self._check()

    def _pad_columns(self, width: int) -> None:
        """Grow the cache to `width` columns with holes at the end."""
        extra = width - self.width
        if extra <= 0:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = _pad_seq(layer.keys, width), _pad_seq(layer.values, width)
        self.valid = torch.cat([self.valid, torch.zeros(len(self.order), extra, dtype=torch.bool,
                                                        device=self.device)], dim=1)

    def _tidy(self) -> None:
        """Crop the hole columns every row has at the end; compact when holes waste too much."""
        if self.cache is None or not self.order:
            return
        used = max((row.slots[-1] + 1 for row in self.rows.values()), default=0)
        if used < self.width:
            self.cache.crop(-(self.width - used))  # transformers 5.x: a negative count to drop
            self.valid = self.valid[:, :used]
        if self.width - max(len(row.ids) for row in self.rows.values()) > self.max_waste:
            self._compact()

    def _compact(self) -> None:
        """Gather each row's slots to the front: one gather per layer tensor."""
        longest = max(len(row.ids) for row in self.rows.values())
        index = torch.zeros(len(self.order), longest, dtype=torch.long)  # [B, longest]; 0 under holes
        valid = torch.zeros(len(self.order), longest, dtype=torch.bool)
        for i, key in enumerate(self.order):
            row = self.rows[key]
            index[i, :len(row.slots)] = torch.tensor(row.slots)
            valid[i, :len(row.slots)] = True
            row.slots = list(range(len(row.slots)))
        index = index.to(self.device)
        for layer in self.cache.layers:
            b, h, _, d = layer.keys.shape
            gather = index[:, None, :, None].expand(b, h, longest, d)
            layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
        self.valid = valid.to(self.device)

    def _check(self) -> None:
        """Per row: columns marked valid == slots == tokens held; the cache is as wide as the mask."""
        if self.cache is None:
            assert not self.rows, f"{self.name}: rows without a cache"
            return
        held = self.cache.get_seq_length()
        assert held == self.width, f"{self.name}: cache holds {held} columns but the mask {self.width}"
        counts = self.valid.sum(dim=1).tolist()
        for key, count in zip(self.order, counts, strict=True):
            row = self.rows[key]
            assert count == len(row.slots) == len(row.ids), (
                f"{row.name}: cache holds {count} positions but {len(row.ids)} tokens")


def _cache_of(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A DynamicCache holding these (keys, values) per layer as they are: building it through
    `DynamicCache(ddp_cache_data)` would copy every tensor once more (its update concatenates)."""
    cache = DynamicCache()
    for keys, values in pairs:
        layer = DynamicLayer()  # what its lazy_initialization sets, without its two empty tensors
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def _pad_last(t: torch.Tensor, width: int) -> torch.Tensor:
    """`t` zero-padded (False-padded) on its last axis to `width`."""
    extra = width - t.shape[-1]
    return torch.nn.functional.pad(t, (0, extra)) if extra > 0 else t


def _pad_seq(t: torch.Tensor, width: int) -> torch.Tensor:
    """[B, H, L, D] zero-padded on the sequence axis to `width` columns (holes)."""
    extra = width - t.shape[-2]
    return torch.nn.functional.pad(t, (0, 0, 0, extra)) if extra > 0 else t
