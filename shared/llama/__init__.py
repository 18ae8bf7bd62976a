"""The llama.cpp edge: every module that calls llama-cpp-python or ggml (loading, the KV
cache's sequences, slot state, grammars, built-in chat templates, embeddings)."""
