"""Constrained decoding's pure half: the `Constraint` interface and the bounds GBNF grammars
and JSON schemas are held to before llama.cpp's parser and converter see them."""
