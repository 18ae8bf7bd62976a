"""bench: duo measured beside lead alone, a raw llama-cpp-python loop and llama-server."""
