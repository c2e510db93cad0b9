"""``flashsplit bench``: decode-attention benchmarks of flashsplit against its peers.

Modules, one job each:

- :mod:`.cases`: model-shape presets, cache formats and attention variants (sliding window,
  softcap, sinks, batch-invariant, appends, rotary), the (batch x seqlen_k x seqlen_q x format x
  variant) grid and its memory cap, the L2-rotation count; several queries per row (``seqlen_q``
  > 1) are causal, bottom-right aligned.
- :mod:`.options`: the option parsers (argparse ``type=`` callables); it imports no other bench module.
- :mod:`.device`: what GPU this is (SMs, L2, datasheet bandwidth).
- :mod:`.inputs`: random input sets (rotated so the KV never sits in L2), in the case's cache
  format: dense or shuffled pages with a block table, 16-bit or fp8 with per-(row, KV head) scales;
  fp32 sinks for a variant with sinks.
- :mod:`.contenders`: flashsplit backends, torch SDPA / FlexAttention, FlashInfer, FlashAttention,
  each behind ``name`` / ``available()`` / ``prepare(case, inputs)``, with why they cannot take a
  cell's format, variant or queries per row (``format_reason``, ``variant_reason``,
  ``queries_reason``).
- :mod:`.masks`: the bottom-right causal masks the torch contenders get for several queries per row.
- :mod:`.check`: compare a contender's output with :func:`flashsplit.reference.attention_ref`
  (which computes the cell's variant, and the causal mask of several queries per row).
- :mod:`.timing`: CUDA-graph replay, CUDA-event and eager wall-clock timers, and the host time
  of an eager call.
- :mod:`.ceiling`: the measured HBM read ceiling.
- :mod:`.floor`: ``--read-floor``: a kernel that only reads a cell's cache, timed as a contender.
- :mod:`.rows`: result dataclasses and their JSON / CSV forms.
- :mod:`.runner`, :mod:`.sweep`: run the grid (or a num_splits sweep) and return rows.
- :mod:`.formats`: ``--compare-formats``: paged / dense time and 16-bit / fp8 speedup per contender.
- :mod:`.variants`: ``--compare-variants``: variant / plain time per contender (and a window's
  time against a cache as short as the window).
- :mod:`.render`: rich tables, dry-run listing, the optional matplotlib plot.
- :mod:`.cli`: the ``bench`` sub-command (``add_bench_parser``, ``run_bench_command``).
- :mod:`.mla`: ``--mla``: MLA decode cells (DeepSeek-V3 shapes) with their read and tensor-core floors.
- :mod:`.models`, :mod:`.model_configs`: ``flashsplit models``: transformers models at real widths
  (random weights), decode and prefill through flashsplit against SDPA or eager attention.

Benchmarks return data; rendering is separate. Nothing here is imported by ``import flashsplit``.
"""
