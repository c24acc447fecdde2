"""The Streamlit dashboard behind ``gastric-fl dashboard``: data, federation, hospital and comparison pages.

It reads and writes only the documented formats (data/README.md: prepared datasets and run directories) and
starts work through the same ``gastric-fl`` commands a person would type. The data-shaping code lives in plain
modules (``datasets``, ``runs``, ``settings``, ``jobs``, ``charts``) that import no Streamlit, so it is tested
without a browser; the page scripts under ``views/`` only lay those results out.
"""
