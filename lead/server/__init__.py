"""Lead over HTTP: the app, the gate, routes, streamed replies, settings, web page, metrics."""
