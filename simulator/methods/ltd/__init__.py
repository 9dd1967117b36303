"""LTD (Learning To Draft): a depth head and a size head, trained by PPO."""
