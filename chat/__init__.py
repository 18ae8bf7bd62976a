"""chat: the REPL client of duo."""
