"""Evaluation: run a policy over questions with a retriever and score it."""
