"""python chat.py: the duo chat REPL (see chat/)."""

from chat.__main__ import main

if __name__ == "__main__":
    main()
