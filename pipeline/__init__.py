"""Raw hospital slides (SEED, BOT, class folders) -> per-hospital tile datasets.

NumPy/OpenCV only: this package never imports torch (docs/design.md, "Layout and layers").
"""
