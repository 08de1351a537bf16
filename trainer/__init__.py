"""Trainer: advantage estimators, the decoupled PPO loss and the training loop."""
