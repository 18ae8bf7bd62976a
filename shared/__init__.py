"""What lead, back, chat and bench share: sampling, the Model interface and small utilities
here; the llama.cpp edge in llama/, grammars and schema bounds in grammar/, what crosses
the wire in wire/."""
