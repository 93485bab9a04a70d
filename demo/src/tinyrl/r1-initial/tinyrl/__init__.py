"""tinyrl: a tiny GRPO trainer."""
__version__ = "0.4.0"
