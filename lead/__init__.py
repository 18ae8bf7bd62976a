"""lead: the target-model server of duo."""
