"""What lead, back, chat and bench share: the wire protocol, sampling, the model edge."""
