"""One training run: the trainer and its phases, set-up, its state on disk, resume, validation, the warm-up, the
overlapped update, the model folder it trains, its metrics and its progress lines."""
