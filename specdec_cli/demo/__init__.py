"""The bundled demo pair: corpus synthesis, tokenizer, training. Checkpoints live in demo/models."""
