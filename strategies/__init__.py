"""One Flower Strategy per algorithm, on the shared `BaseStrategy`."""
