"""Sentence-transformers models reading long documents: late chunks and the chunker (``posswap.late_chunks``,
``posswap.split_text``), the retrieval tasks with their chunk baselines (LongEmbed's passkey and needle, the
contextual chunk task), the verdict on which way of keeping a document wins, the embedding recipes' training
(:mod:`.training`) and the report tables written from their results (``python -m posswap.cli.generate --write``).

Nothing is imported here: ``posswap.embeddings.training.recipe`` is read with every recipe and must stay light."""
