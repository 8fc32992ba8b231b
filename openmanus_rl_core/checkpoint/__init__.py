"""Checkpoints: atomic, verified folders of tensors (:mod:`.store`) and the random-number state saved in them
(:mod:`.rng`)."""
