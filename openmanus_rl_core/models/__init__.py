"""Models and tokenizers: loading a Hugging Face folder or building the tiny default, LoRA, and the shared prompt."""
