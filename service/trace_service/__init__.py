"""trace-rollout service: allocation algorithms, predictor, tree store and the HTTP API."""
