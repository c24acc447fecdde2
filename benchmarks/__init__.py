"""Benchmarks: scripts that print figures and write them to ``benchmarks/results/``.

A regular package, so that ``benchmarks._common`` is this folder's even where an installed distribution ships a
top-level ``benchmarks`` package of its own (opacus 1.6 does).
"""
