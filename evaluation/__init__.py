"""Evaluation: the run's own agent on held-out tasks through the proxy, scored, never trained on."""
