"""Task data: task files (parquet), OpenManus-RL's layout, generated task splits, and the sampler that draws them."""
