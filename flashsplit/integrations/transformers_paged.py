"""Continuous batching (``model.generate_batch``) through flashsplit: the ``"paged|" + name``
attention that :func:`flashsplit.integrations.transformers.register` also registers.

transformers' continuous batching packs the batch's new tokens into one sequence (``query``
``[1, H, T_q, D]``, rows delimited by ``cu_seq_lens_q``) and keeps the KV cache in a
``PagedAttentionCache``: per layer a ``[slots, H_kv, D]`` tensor, each row's tokens at the
physical slots its ``read_index`` lists (``write_index`` for the new ones). It builds no
attention mask for an implementation of its own, and passes a block table only to FlashAttention
2/3 names, so every step arrives here as a packed ("varlen") batch:

- **Decode** (every row brings at most ``max_decode_queries`` tokens): full-attention layers
  write the new keys and values into the cache and attend it **in place**, as a paged cache of
  one-key pages whose page table is each row's read indices (no gather of the cache); sliding
  layers go through the cache's own ``update`` (its ring buffer must be read before it is
  written) and attend the gathered keys the same way. Rows with fewer queries than the longest
  are left-padded into a ``[B, L, H, D]`` block, so causal alignment puts each row's queries at
  its last keys. One :func:`flashsplit.decode` per layer; no host sync.
- **Prefill** (a longer row): the cache's ``update`` gathers the keys, and SDPA (FlexAttention for
  a softcap or sinks) attends them under a block-diagonal causal mask built on the device from
  ``cu_seq_lens_q``/``cu_seq_lens_k`` (:class:`PackedMask`: dense for SDPA, blocks for FlexAttention).
"""

from __future__ import annotations

import torch

from ..api import decode
from .flex_prefill import block_mask_from
from .prefill_mask import PrefillMask
from .transformers_routing import decode_blocker, prefill_attention


def make_paged_attention(settings):
    """The ``"paged|" + name`` attention function for ``settings`` (a
    :class:`~flashsplit.integrations.transformers_routing.DecodeSettings`)."""
    def paged_split_kv_attention(module, query, key, value, attention_mask, cache=None, cu_seq_lens_q=None,
                                 cu_seq_lens_k=None, max_seqlen_q=None, max_seqlen_k=None, block_table=None,
                                 **kwargs):
        """``query`` ``[1, H, T_q, D]``, ``key``/``value`` ``[1, H_kv, T_q, D]`` (the new tokens,
        packed) -> (``[1, T_q, H, D]``, None)."""
        if cache is None or cu_seq_lens_q is None or cu_seq_lens_k is None:
            raise ValueError(f"{type(module).__name__}: the paged attention needs continuous batching's cache and "
                             f"cu_seq_lens_q/cu_seq_lens_k; use the implementation without 'paged|' elsewhere")
        if block_table is not None:
            raise ValueError("block_table: the paged attention reads the cache through its read indices; "
                             "transformers passes block tables only to FlashAttention implementations")
        sliding = cache.sliding_windows[module.layer_idx] > 1
        if isinstance(cu_seq_lens_k, dict):
            layer_type = "sliding_attention" if sliding else "full_attention"
            cu_seq_lens_k, max_seqlen_k = cu_seq_lens_k[layer_type], max_seqlen_k[layer_type]
        step = PackedStep(cu_seq_lens_q, cu_seq_lens_k, query.shape[2], max_seqlen_q, max_seqlen_k)
        blocker = decode_blocker(module, query[:, :, :1], key, value, None, kwargs.get("dropout", 0.0), settings,
                                 kwargs)
        if step.max_q > settings.max_decode_queries or blocker is not None:
            k, v = _gather(cache, module, key, value, kwargs)
            mask = PackedMask(step, k.shape[0], kwargs.get("sliding_window"), query.dtype)
            return prefill_attention(module, query, k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, **kwargs)
        return decode_packed(module, query, key, value, cache, step, sliding, settings, **kwargs), None

    return paged_split_kv_attention


class PackedStep:
    """A packed batch's layout: ``B`` rows (``cu_seq_lens_q``/``cu_seq_lens_k``, int ``[B + 1]``),
    ``T_q`` query tokens in all (padding past ``cu_seq_lens_q[B]`` included), at most ``max_q``
    queries and ``max_k`` keys per row (host ints, as transformers passes them)."""

    def __init__(self, cu_seq_lens_q, cu_seq_lens_k, total_q: int, max_q: int, max_k: int):
        self.cu_q, self.cu_k = cu_seq_lens_q.long(), cu_seq_lens_k.long()
        self.batch = cu_seq_lens_q.shape[0] - 1
        self.total_q, self.max_q, self.max_k = total_q, max(int(max_q), 1), max(int(max_k), 1)
        self.len_q = self.cu_q[1:] - self.cu_q[:-1]
        self.len_k = self.cu_k[1:] - self.cu_k[:-1]

    def token_rows(self, total: int, cu: torch.Tensor) -> torch.Tensor:
        """The row of each of ``total`` packed tokens (``B`` for padding past ``cu[B]``)."""
        tokens = torch.arange(total, device=cu.device)
        return torch.searchsorted(cu[1:], tokens, right=True)

    def query_block_index(self) -> torch.Tensor:
        """``[B, L]``: the packed query each slot of the left-padded ``[B, L]`` block holds (row b's
        queries in its last ``len_q[b]`` slots; other slots repeat a valid index, never read back)."""
        slots = torch.arange(self.max_q, device=self.cu_q.device)
        index = self.cu_q[1:, None] - self.max_q + slots[None, :]
        return index.clamp(0, max(self.total_q - 1, 0))

    def query_unpad_index(self) -> torch.Tensor:
        """``[T_q]``: the slot of the flattened ``[B * L]`` block that holds each packed query."""
        rows = self.token_rows(self.total_q, self.cu_q).clamp(max=self.batch - 1)
        tokens = torch.arange(self.total_q, device=self.cu_q.device)
        slot = self.max_q - (self.cu_q[rows + 1] - tokens)
        return rows * self.max_q + slot.clamp(0, self.max_q - 1)

    def page_table(self, slots: torch.Tensor) -> torch.Tensor:
        """int32 ``[B, max_k]``: key ``n`` of row ``b`` lives at ``slots[cu_seq_lens_k[b] + n]``
        (entries past a row's length repeat a valid slot and are never read)."""
        index = self.cu_k[:-1, None] + torch.arange(self.max_k, device=self.cu_k.device)[None, :]
        return slots[index.clamp(0, slots.shape[0] - 1)].to(torch.int32)

    def mask_mod(self, total_k: int, sliding_window):
        """FlexAttention's ``mask_mod(b, h, q, k)`` over ``T_q`` packed queries and ``T_k`` packed
        keys: True where query q may see key k (its row's, causal with the queries at the row's
        last keys, within ``sliding_window``). Reads four ``[T]`` vectors, no ``T_q x T_k`` tensor."""
        rows_q = self.token_rows(self.total_q, self.cu_q)
        rows_k = self.token_rows(total_k, self.cu_k)
        valid_q = rows_q < self.batch
        rows_q, rows_k_clamped = rows_q.clamp(max=self.batch - 1), rows_k.clamp(max=self.batch - 1)
        tokens_q = torch.arange(self.total_q, device=self.cu_q.device)
        tokens_k = torch.arange(total_k, device=self.cu_k.device)
        position_q = tokens_q - self.cu_q[rows_q] + self.len_k[rows_q] - self.len_q[rows_q]
        position_q = torch.where(valid_q, position_q, -1)  # padding queries see nothing
        position_k = tokens_k - self.cu_k[rows_k_clamped]
        window = int(sliding_window) if sliding_window else 0

        def visible(b, h, q, k):
            seen = (rows_q[q] == rows_k[k]) & (position_k[k] <= position_q[q])
            if window:
                seen = seen & (position_k[k] > position_q[q] - window)
            return seen

        return visible

    def additive_mask(self, total_k: int, sliding_window, dtype) -> torch.Tensor:
        """``[1, 1, T_q, T_k]``: 0 where a query may see a key (:meth:`mask_mod`), the dtype's
        minimum elsewhere."""
        visible = self.mask_mod(total_k, sliding_window)
        q = torch.arange(self.total_q, device=self.cu_q.device)[:, None]
        k = torch.arange(total_k, device=self.cu_k.device)[None, :]
        seen = visible(0, 0, q, k)
        mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
        return mask.masked_fill_(~seen, torch.finfo(dtype).min)[None, None]


class PackedMask(PrefillMask):
    """A packed prefill's mask, in the form the layer reads: the additive ``[1, 1, T_q, T_k]``
    mask for SDPA (:meth:`PackedStep.additive_mask`), a block mask for FlexAttention."""

    def __init__(self, step: PackedStep, total_k: int, sliding_window, dtype) -> None:
        super().__init__(dict(batch_size=1, q_length=step.total_q, kv_length=total_k))
        self.step, self.sliding_window, self.dtype = step, sliding_window, dtype

    def dense(self) -> torch.Tensor:
        if not self._dense_built:
            total_k = self.mask_kwargs["kv_length"]
            self._dense = self.step.additive_mask(total_k, self.sliding_window, self.dtype)
            self._dense_built = True
        return self._dense

    def block_mask(self, device: torch.device):
        if self._block is None:
            total_k = self.mask_kwargs["kv_length"]
            self._block = block_mask_from(self.step.mask_mod(total_k, self.sliding_window), None,
                                          self.step.total_q, total_k, device)
        return self._block


def _gather(cache, module, key, value, kwargs):
    """transformers' own cache update: writes the new keys and returns every row's keys and
    values, packed ``[T_k, H_kv, D]`` (a sliding layer's ring read before it is written)."""
    return cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                        read_index=kwargs["read_index"], write_index=kwargs["write_index"])


def decode_packed(module, query, key, value, cache, step: PackedStep, sliding: bool, settings, scaling=None,
                  sliding_window=None, softcap=None, s_aux=None, **kwargs) -> torch.Tensor:
    """One packed decode step through :func:`flashsplit.decode`: ``[1, T_q, H, D]``."""
    _, num_heads, total_q, head_dim = query.shape
    num_heads_kv = key.shape[1]
    if sliding:
        k, v = _gather(cache, module, key, value, kwargs)
        slots = torch.arange(k.shape[0], device=k.device)
    else:
        group, index = cache.layer_index_to_group_indices[module.layer_idx]
        write_index = kwargs["write_index"][group]
        read_index = kwargs["read_index"][group]
        k, v = cache.key_cache[index], cache.value_cache[index]
        k.index_copy_(0, write_index, key[0].transpose(0, 1))
        v.index_copy_(0, write_index, value[0].transpose(0, 1))
        # With no past key in the batch the rows' keys are their new ones, at the write indices.
        slots = read_index if read_index.numel() else write_index
    table = step.page_table(slots)
    k_pages = k.view(-1, 1, num_heads_kv, head_dim)
    v_pages = v.view(-1, 1, num_heads_kv, head_dim)
    q = query[0].transpose(0, 1)  # [T_q, H, D]
    one_per_row = step.max_q == 1 and total_q == step.batch
    q_block = q[:, None] if one_per_row else q[step.query_block_index()]  # [B, L, H, D]
    window = (sliding_window - 1, 0) if sliding_window else (-1, -1)
    out = torch.empty((step.batch, step.max_q, num_heads, head_dim), dtype=query.dtype, device=query.device)
    decode(q_block, k_pages, v_pages, out=out, block_table=table, cache_seqlens=step.len_k.to(torch.int32),
           softmax_scale=scaling, causal=step.max_q > 1, window_size=window, softcap=float(softcap or 0.0),
           sinks=None if s_aux is None else s_aux.detach().contiguous(), backend=settings.backend)
    if one_per_row:
        return out.view(1, total_q, num_heads, head_dim)
    return out.view(-1, num_heads, head_dim)[step.query_unpad_index()][None]
