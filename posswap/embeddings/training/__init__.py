"""``posswap train`` for a recipe with an ``embedding:`` block: sentence-transformers' own trainer on pairs cut from
the training text, with the teachers and the context pairs (:mod:`.trainer`, read top to bottom)."""
