"""back: the draft worker of duo."""
