"""Integrations of flashsplit into model libraries (each imports its library lazily).

- :mod:`flashsplit.integrations.transformers`: Hugging Face transformers' attention interface
  (``register()`` returns the ``attn_implementation`` name to use).
"""
