"""Drafts: the boards backs and lead's own kinds post on, lead's own drafts."""
