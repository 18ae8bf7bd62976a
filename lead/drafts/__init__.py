"""Drafts and the backs that post them: boards, what backs see, the link, own drafts, odds."""
