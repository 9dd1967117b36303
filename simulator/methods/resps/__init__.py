"""Re-SpS: one tree shape held N cycles, trained by PPO with held actions."""
