"""bench: side-by-side measurements of duo against a raw llama-cpp-python loop."""
