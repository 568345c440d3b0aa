"""Tooling that builds SwarmLLM's embedded default model (resources/models/swarmllm-pydoc-q8_0.gguf).

Run it as a script, not with ``-m``: the top-level ``packaging/`` folder is not a Python package
(it would shadow the PyPA ``packaging`` library), so ``train.py`` puts ``packaging/`` on sys.path
and imports this folder as ``default_model``::

    python packaging/default_model/train.py --out resources/models
"""
