"""One step for every generation: admission, slots, the loop, the model call, verification."""
