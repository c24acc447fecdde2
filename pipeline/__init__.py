"""Raw hospital slides (SEED, BOT, class folders) -> per-hospital tile datasets.

NumPy/OpenCV only: this package never imports torch (DESIGN.md, "The layout").
"""
