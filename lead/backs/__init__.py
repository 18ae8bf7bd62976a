"""Everything about backs on lead's side: the feed, the link, the registry, limits, routes."""
