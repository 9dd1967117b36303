"""RADAR: stop / continue per depth level, trained by REINFORCE with a baseline."""
