"""Training frameworks and loops under one session: Hugging Face ``Trainer``, Lightning,
``accelerate`` and a plain loop (the recipes of docs/integrations.md), and what the
frameworks do with tensors (copies, pickles)."""
