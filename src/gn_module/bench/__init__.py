"""The benchmark harness: ours vs PyTorch eager vs torch.compile, CUDA-event timed.

Modules: ``cases`` (shape table, bytes, size classes), ``impls`` (what is timed), ``timing`` (events,
L2 flush, copy bandwidth), ``timer`` (pytest-benchmark glue), ``results``, ``targets``, ``report``,
``device`` (machine identity and run conditions), ``history`` (saved pytest-benchmark runs),
``cli`` (``python -m gn_module.bench``). The runtime (``gn_module``) never imports this package.
"""
