"""How the figures leave: the poller, fleet mode, the collectors, the HTTP server, the app."""
